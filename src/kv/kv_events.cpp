#include "kv/kv_events.h"

#include <cstring>
#include <string_view>

#include "core/check.h"

namespace oscar::kv {

const BlockDigest& root_block_digest() {
  static const BlockDigest root = [] {
    constexpr std::string_view kDomain = "oscar.kv_events.v1.root";
    return sha256(
        std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(kDomain.data()), kDomain.size()));
  }();
  return root;
}

BlockDigest chain_block_digest(const BlockDigest& parent, std::span<const int32_t> tokens) {
  Sha256 hasher;
  hasher.update(parent.data(), parent.size());
  // Explicit little-endian bytes, so the hash does not depend on the host's byte order.
  const auto put_u32 = [](uint8_t* out, uint32_t v) {
    for (int i = 0; i < 4; ++i) out[i] = static_cast<uint8_t>(v >> (8 * i));
  };
  uint8_t count[4];
  put_u32(count, static_cast<uint32_t>(tokens.size()));
  hasher.update(count, sizeof(count));
  uint8_t chunk[256];
  size_t n = 0;
  for (int32_t token : tokens) {
    put_u32(chunk + n, static_cast<uint32_t>(token));
    n += 4;
    if (n == sizeof(chunk)) {
      hasher.update(chunk, n);
      n = 0;
    }
  }
  hasher.update(chunk, n);
  return hasher.finish();
}

BlockHash external_block_hash(const BlockDigest& digest) {
  BlockHash h = 0;
  for (size_t i = digest.size() - 8; i < digest.size(); ++i) h = (h << 8) | digest[i];
  return h;
}

std::vector<BlockHash> block_hashes_of_path(std::span<const int32_t> tokens, int32_t page_size) {
  OSCAR_CHECK(page_size > 0, "kv events: page_size %d", page_size);
  const size_t p = static_cast<size_t>(page_size);
  std::vector<BlockHash> hashes;
  hashes.reserve(tokens.size() / p);
  BlockDigest digest = root_block_digest();
  for (size_t pos = 0; pos + p <= tokens.size(); pos += p) {
    digest = chain_block_digest(digest, tokens.subspan(pos, p));
    hashes.push_back(external_block_hash(digest));
  }
  return hashes;
}

void KvEventCollector::on_stored(std::span<const BlockHash> block_hashes,
                                 std::optional<BlockHash> parent_block_hash,
                                 std::span<const int32_t> token_ids, int32_t block_size) {
  BlockStored e;
  e.block_hashes.assign(block_hashes.begin(), block_hashes.end());
  e.parent_block_hash = parent_block_hash;
  e.token_ids.assign(token_ids.begin(), token_ids.end());
  e.block_size = block_size;
  events_.emplace_back(std::move(e));
}

void KvEventCollector::on_removed(std::span<const BlockHash> block_hashes) {
  events_.emplace_back(BlockRemoved{{block_hashes.begin(), block_hashes.end()}});
}

void KvEventCollector::on_cleared() { events_.emplace_back(AllBlocksCleared{}); }

std::vector<KvEvent> KvEventCollector::take() {
  std::vector<KvEvent> out;
  out.swap(events_);
  return out;
}

Status KvBlockMirror::apply(const KvEvent& event) {
  if (const auto* stored = std::get_if<BlockStored>(&event)) {
    const size_t n = stored->block_hashes.size();
    if (n == 0 || stored->block_size <= 0 ||
        stored->token_ids.size() != n * static_cast<size_t>(stored->block_size)) {
      return invalid_argument("kv events: BlockStored with %zu hashes, %zu tokens, block_size %d",
                              n, stored->token_ids.size(), stored->block_size);
    }
    std::optional<BlockHash> parent = stored->parent_block_hash;
    if (parent && !blocks_.contains(*parent)) {
      return invalid_argument("kv events: BlockStored parent %llu is not cached",
                              static_cast<unsigned long long>(*parent));
    }
    for (size_t i = 0; i < n; ++i) {
      const BlockHash h = stored->block_hashes[i];
      if (blocks_.contains(h)) {
        return invalid_argument("kv events: block %llu stored twice",
                                static_cast<unsigned long long>(h));
      }
      Block block;
      block.parent = parent;
      const auto first = stored->token_ids.begin() + static_cast<ptrdiff_t>(i * stored->block_size);
      block.token_ids.assign(first, first + stored->block_size);
      if (parent) ++blocks_.at(*parent).n_children;
      blocks_.emplace(h, std::move(block));
      parent = h;
    }
    return Status();
  }
  if (const auto* removed = std::get_if<BlockRemoved>(&event)) {
    for (BlockHash h : removed->block_hashes) {
      auto it = blocks_.find(h);
      if (it == blocks_.end()) {
        return invalid_argument("kv events: BlockRemoved of unknown block %llu",
                                static_cast<unsigned long long>(h));
      }
      if (it->second.n_children > 0) {
        return invalid_argument("kv events: BlockRemoved of block %llu with %d cached children",
                                static_cast<unsigned long long>(h), it->second.n_children);
      }
      if (it->second.parent) --blocks_.at(*it->second.parent).n_children;
      blocks_.erase(it);
    }
    return Status();
  }
  blocks_.clear();  // AllBlocksCleared
  return Status();
}

Status KvBlockMirror::apply_all(std::span<const KvEvent> events) {
  for (const KvEvent& event : events) {
    Status s = apply(event);
    if (!s.ok()) return s;
  }
  return Status();
}

}  // namespace oscar::kv
