// KV-cache events: the model of what a KV-aware router (llm-d's KV-cache indexer, NVIDIA Dynamo's
// router) learns from a replica about its prefix cache, and how oscar names each cached page.
// Events follow vLLM's KV-events schema (docs/formats/kv_events.md): BlockStored (a run of pages
// of one path, with the hash of the page before it), BlockRemoved and AllBlocksCleared. The
// RadixCache is the source (RadixCache::set_listener): one event for every page inserted, evicted
// or cleared. Here live the block hash, the listener interface, the per-step collector, the sink
// the scheduler hands each step's batch to, and a consumer-side mirror that rebuilds the block set
// from the events (tests and debugging). The wire encoding (msgpack) and the ZMQ transport do not
// live here: see server/kv_event_publisher.h, the one place that depends on libzmq and msgpack.
//
// Block hash. A page's digest is SHA-256 over (the digest of the page before it on the path, or a
// fixed root digest for the first page; the page's token count; its token ids), so it names the
// exact token path from the root through that page, never a truncated key. The chain runs over the
// full 32-byte digests; only the published BlockHash is the last 8 bytes read big-endian, which is
// what vLLM publishes (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES, the default) and what llm-d reads from
// a bytes hash. Routers key their index on (replica, BlockHash) and re-hash the token ids of each
// BlockStored themselves, so the hash need not equal vLLM's, only be stable and collision-free
// within one replica's stream.
//
// Thread-safety: the listener, the collector and the mirror run on the thread that owns the
// RadixCache (the scheduler's loop). KvEventSink::publish must be safe to call from that thread
// and must not block it.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <variant>
#include <vector>

#include "core/sha256.h"
#include "core/status.h"

namespace oscar::kv {

using BlockDigest = Sha256Digest;  // chains: the digest of a page's whole token path
using BlockHash = uint64_t;        // published: the last 8 bytes of the digest, big-endian

// The digest "before" the first page of every path: SHA-256("oscar.kv_events.v1.root").
const BlockDigest& root_block_digest();
// SHA-256(parent[32] || uint32_le(tokens.size()) || int32_le(tokens[0]) || ... ).
BlockDigest chain_block_digest(const BlockDigest& parent, std::span<const int32_t> tokens);
BlockHash external_block_hash(const BlockDigest& digest);
// The published hash of each whole page of `tokens` (a path from the root):
// [tokens.size() / page_size]; a trailing partial page is not hashed (it is never cached).
std::vector<BlockHash> block_hashes_of_path(std::span<const int32_t> tokens, int32_t page_size);

// The three event kinds, as vLLM names them. block_size is tokens per page (page_size).
struct BlockStored {
  std::vector<BlockHash> block_hashes;         // [n_blocks], in path order
  std::optional<BlockHash> parent_block_hash;  // the page before block_hashes[0]; none at the root
  std::vector<int32_t> token_ids;              // [n_blocks * block_size], the blocks' tokens
  int32_t block_size = 0;
  friend bool operator==(const BlockStored&, const BlockStored&) = default;
};
struct BlockRemoved {
  std::vector<BlockHash> block_hashes;  // in removal order (deepest first within a path)
  friend bool operator==(const BlockRemoved&, const BlockRemoved&) = default;
};
struct AllBlocksCleared {
  friend bool operator==(const AllBlocksCleared&, const AllBlocksCleared&) = default;
};
using KvEvent = std::variant<BlockStored, BlockRemoved, AllBlocksCleared>;

// What the RadixCache calls, synchronously, on its owner's thread. The spans are valid only for
// the duration of the call. Order guarantees: a block is stored after its parent and removed
// before its parent (eviction trims leaves from the tail), so the announced set is always closed
// under prefixes.
class KvEventListener {
 public:
  virtual ~KvEventListener() = default;
  // A run of consecutive pages of one path became cached: block_hashes [n],
  // token_ids [n * block_size].
  virtual void on_stored(std::span<const BlockHash> block_hashes,
                         std::optional<BlockHash> parent_block_hash,
                         std::span<const int32_t> token_ids, int32_t block_size) = 0;
  // These pages left the cache (evicted; a running sequence may still hold its own reference).
  virtual void on_removed(std::span<const BlockHash> block_hashes) = 0;
  // The whole cache was dropped (RadixCache::reset), or a listener was attached (a fresh view).
  virtual void on_cleared() = 0;
};

// A listener that queues the events in order until take(): the scheduler attaches one to its
// RadixCache and, once per step, hands take() to a KvEventSink. Copies token ids once per stored
// page. Not thread-safe (the cache's owner thread).
class KvEventCollector final : public KvEventListener {
 public:
  void on_stored(std::span<const BlockHash> block_hashes,
                 std::optional<BlockHash> parent_block_hash, std::span<const int32_t> token_ids,
                 int32_t block_size) override;
  void on_removed(std::span<const BlockHash> block_hashes) override;
  void on_cleared() override;

  bool empty() const { return events_.empty(); }
  size_t size() const { return events_.size(); }
  std::vector<KvEvent> take();  // the events since the last take(), oldest first

 private:
  std::vector<KvEvent> events_;
};

// Where each step's events go (server::KvEventPublisher sends them over ZMQ). publish() is
// called on the scheduler's thread with a non-empty batch and must return without waiting for
// I/O; an implementation may drop a batch under backpressure, but must count it in
// dropped_batches(), so that the owner of the cache can resynchronise its routers (attach the
// collector again: RadixCache::set_listener announces AllBlocksCleared and the whole cache).
class KvEventSink {
 public:
  virtual ~KvEventSink() = default;
  virtual void publish(std::vector<KvEvent> events) = 0;
  virtual int64_t dropped_batches() const { return 0; }  // thread-safe, cumulative
};

// The block set a router rebuilds from one replica's events, applied in order. apply() checks the
// stream as a strict router would and names the first violation: a block stored twice, a parent
// that is not cached, token_ids whose length is not n_blocks * block_size, a removed block that is
// unknown or is still the parent of a cached block. Not thread-safe.
class KvBlockMirror {
 public:
  struct Block {
    std::optional<BlockHash> parent;
    std::vector<int32_t> token_ids;  // [block_size]
    int32_t n_children = 0;          // cached blocks whose parent this is
  };
  Status apply(const KvEvent& event);
  Status apply_all(std::span<const KvEvent> events);
  const std::unordered_map<BlockHash, Block>& blocks() const { return blocks_; }
  size_t size() const { return blocks_.size(); }

 private:
  std::unordered_map<BlockHash, Block> blocks_;
};

}  // namespace oscar::kv
