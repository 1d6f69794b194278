// KvEventPublisher: sends the KV-cache events of one oscar replica (kv/kv_events.h) to KV-aware
// routers in vLLM's wire format (docs/formats/kv_events.md): a ZMQ PUB socket carrying
// three-frame messages [topic, 8-byte big-endian sequence number, msgpack KVEventBatch], and,
// optionally, vLLM's replay ROUTER socket that resends buffered batches from a requested sequence
// number. Also the msgpack encoder (encode_kv_event_batch), which is the one definition of the
// payload bytes. This file is the only place that depends on libzmq, cppzmq and msgpack-cxx; it
// does not depend on Beast or on the HTTP server, and nothing here touches the radix cache.
//
// Threads: publish() is called on the scheduler's loop thread and never blocks on I/O: it stamps
// the batch (wall-clock ts, the next sequence number) and moves it into a bounded queue under a
// short mutex. A full queue drops the batch and counts it (stats().dropped_batches); its sequence
// number is still consumed, so subscribers see the gap (replay cannot fill it: the batch was never
// encoded; a router should then treat this replica's view as stale, and the scheduler can resync
// by attaching its collector again, RadixCache::set_listener). One sender thread, owned here,
// encodes, sends, keeps the last replay_buffer_batches payloads and answers replay requests; it
// alone touches the sockets. The destructor sends what is queued (up to shutdown_timeout_ms),
// then stops the thread and closes the sockets.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"
#include "kv/kv_events.h"

namespace oscar::server {

// How each event inside the batch is encoded; the batch itself is always a 3-element array.
enum class KvEventEncoding {
  kMap,    // tagged maps {"type": "BlockStored", ...}: vLLM since #42892 (mid-2026), the default
  kArray,  // tagged positional arrays ["BlockStored", ...]: older vLLM and the routers built for it
};

struct KvEventPublisherOptions {
  // vLLM's rule: an endpoint with "*" or "::", or ipc:// / inproc://, binds; any other connects
  // (llm-d's indexer binds a SUB socket and replicas connect to it; Dynamo connects to replicas).
  // "tcp://127.0.0.1:*" binds an ephemeral port (see KvEventPublisher::endpoint()).
  std::string endpoint = "tcp://*:5557";
  std::string replay_endpoint;     // "" = no replay socket; a ROUTER that always binds
  std::string topic;               // frame 0; llm-d expects "kv@<pod-id>@<model-name>"
  int32_t data_parallel_rank = 0;  // in every batch; tcp ports are offset by it, as in vLLM
  KvEventEncoding encoding = KvEventEncoding::kMap;
  std::string medium = "GPU";             // vLLM's MEDIUM_GPU: the engine's primary KV cache
  int64_t max_queue_batches = 100000;     // queued, not yet sent; beyond: drop and count
  int64_t replay_buffer_batches = 10000;  // vLLM's buffer_steps
  int32_t send_hwm = 100000;              // ZMQ_SNDHWM of the PUB socket
  int32_t shutdown_timeout_ms = 1000;

  Status validate() const;
};

struct KvEventPublisherStats {
  int64_t queued_batches = 0;   // accepted by publish()
  int64_t dropped_batches = 0;  // refused by publish() (queue full); their sequence numbers gap
  int64_t dropped_events = 0;
  int64_t sent_batches = 0;  // handed to the PUB socket
  int64_t send_errors = 0;
  int64_t replay_requests = 0;
  int64_t next_seq = 0;  // the sequence number the next batch gets
};

// The msgpack payload of one batch: [ts (float64), [event, ...], data_parallel_rank]. Exposed
// for tests and tools; the publisher calls it on its sender thread.
std::string encode_kv_event_batch(double ts, std::span<const kv::KvEvent> events,
                                  int32_t data_parallel_rank, KvEventEncoding encoding,
                                  const std::string& medium);

// vLLM's offset_endpoint_port: tcp ports + rank, inproc names + "_dp<rank>", rank 0 unchanged.
Result<std::string> offset_endpoint_port(const std::string& endpoint, int32_t data_parallel_rank);
// Whether vLLM's rule binds (rather than connects) this PUB endpoint.
bool kv_event_endpoint_binds(const std::string& endpoint);

class KvEventPublisher final : public kv::KvEventSink {
 public:
  // Creates the sockets (bind or connect), then starts the sender thread. Fails on a bad option
  // or an endpoint ZMQ refuses (address in use, unknown host, bad syntax).
  static Result<std::unique_ptr<KvEventPublisher>> create(KvEventPublisherOptions options);
  ~KvEventPublisher() override;
  KvEventPublisher(const KvEventPublisher&) = delete;
  KvEventPublisher& operator=(const KvEventPublisher&) = delete;

  // Thread-safe; returns at once. Empty batches are ignored (no sequence number).
  void publish(std::vector<kv::KvEvent> events) override;
  int64_t dropped_batches() const override;
  // Blocks until every accepted batch has been sent (tests, shutdown); never on the scheduler.
  void flush();

  KvEventPublisherStats stats() const;
  // The endpoints actually in use (a bound "*" port resolved through ZMQ_LAST_ENDPOINT).
  const std::string& endpoint() const { return endpoint_; }
  const std::string& replay_endpoint() const { return replay_endpoint_; }
  const KvEventPublisherOptions& options() const { return options_; }

 private:
  struct Impl;  // ZMQ context and sockets (sender thread only)
  struct Pending {
    int64_t seq = 0;
    double ts = 0;
    std::vector<kv::KvEvent> events;
  };
  explicit KvEventPublisher(KvEventPublisherOptions options);
  void sender_loop();

  KvEventPublisherOptions options_;
  std::string endpoint_;
  std::string replay_endpoint_;
  std::unique_ptr<Impl> impl_;

  mutable std::mutex mu_;
  std::condition_variable wake_;     // sender: work or stop
  std::condition_variable drained_;  // flush(): queue empty and nothing in flight
  std::deque<Pending> queue_;        // guarded by mu_
  bool in_flight_ = false;           // guarded by mu_: the sender holds batches taken from queue_
  bool stop_ = false;                // guarded by mu_
  KvEventPublisherStats stats_;      // guarded by mu_
  std::thread sender_;
};

}  // namespace oscar::server
