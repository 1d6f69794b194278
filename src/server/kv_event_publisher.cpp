#include "server/kv_event_publisher.h"

#include <chrono>
#include <cstring>
#include <iterator>
#include <msgpack.hpp>
#include <optional>
#include <utility>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "core/check.h"
#include "core/log.h"

namespace oscar::server {
namespace {

using Packer = msgpack::packer<msgpack::sbuffer>;

void pack_string(Packer& pk, std::string_view s) {
  pk.pack_str(static_cast<uint32_t>(s.size()));
  pk.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
}

void pack_hashes(Packer& pk, std::span<const kv::BlockHash> hashes) {
  pk.pack_array(static_cast<uint32_t>(hashes.size()));
  for (kv::BlockHash h : hashes) pk.pack_uint64(h);
}

void pack_optional_hash(Packer& pk, const std::optional<kv::BlockHash>& h) {
  if (h) {
    pk.pack_uint64(*h);
  } else {
    pk.pack_nil();
  }
}

void pack_tokens(Packer& pk, std::span<const int32_t> tokens) {
  pk.pack_array(static_cast<uint32_t>(tokens.size()));
  for (int32_t t : tokens) pk.pack_int32(t);
}

// Field order follows vLLM's struct declarations (msgspec writes the tag first, then the fields
// in declaration order; fields with a default that equals it are omitted: omit_defaults=True).
void pack_event_map(Packer& pk, const kv::KvEvent& event, const std::string& medium) {
  if (const auto* e = std::get_if<kv::BlockStored>(&event)) {
    pk.pack_map(10);
    pack_string(pk, "type");
    pack_string(pk, "BlockStored");
    pack_string(pk, "block_hashes");
    pack_hashes(pk, e->block_hashes);
    pack_string(pk, "parent_block_hash");
    pack_optional_hash(pk, e->parent_block_hash);
    pack_string(pk, "token_ids");
    pack_tokens(pk, e->token_ids);
    pack_string(pk, "block_size");
    pk.pack_int32(e->block_size);
    pack_string(pk, "lora_id");
    pk.pack_nil();
    pack_string(pk, "medium");
    pack_string(pk, medium);
    pack_string(pk, "lora_name");
    pk.pack_nil();
    // extra_keys (default None) is omitted; one KV-cache group, full attention.
    pack_string(pk, "group_idx");
    pk.pack_int32(0);
    pack_string(pk, "kv_cache_spec_kind");
    pack_string(pk, "full_attention");
  } else if (const auto* r = std::get_if<kv::BlockRemoved>(&event)) {
    pk.pack_map(4);
    pack_string(pk, "type");
    pack_string(pk, "BlockRemoved");
    pack_string(pk, "block_hashes");
    pack_hashes(pk, r->block_hashes);
    pack_string(pk, "medium");
    pack_string(pk, medium);
    pack_string(pk, "group_idx");
    pk.pack_int32(0);
  } else {
    pk.pack_map(1);
    pack_string(pk, "type");
    pack_string(pk, "AllBlocksCleared");
  }
}

// The positional form of the last array-encoded vLLM releases (tag first, then the fields up to
// lora_name; trailing defaulted fields omitted), which llm-d's and Dynamo's legacy decoders read.
void pack_event_array(Packer& pk, const kv::KvEvent& event, const std::string& medium) {
  if (const auto* e = std::get_if<kv::BlockStored>(&event)) {
    pk.pack_array(8);
    pack_string(pk, "BlockStored");
    pack_hashes(pk, e->block_hashes);
    pack_optional_hash(pk, e->parent_block_hash);
    pack_tokens(pk, e->token_ids);
    pk.pack_int32(e->block_size);
    pk.pack_nil();  // lora_id
    pack_string(pk, medium);
    pk.pack_nil();  // lora_name
  } else if (const auto* r = std::get_if<kv::BlockRemoved>(&event)) {
    pk.pack_array(3);
    pack_string(pk, "BlockRemoved");
    pack_hashes(pk, r->block_hashes);
    pack_string(pk, medium);
  } else {
    pk.pack_array(1);
    pack_string(pk, "AllBlocksCleared");
  }
}

std::string seq_bytes(int64_t seq) {  // 8 bytes, big-endian, two's complement (-1 = end marker)
  std::string out(8, '\0');
  const uint64_t u = static_cast<uint64_t>(seq);
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>(u >> (56 - 8 * i));
  return out;
}

double wall_clock_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

std::string encode_kv_event_batch(double ts, std::span<const kv::KvEvent> events,
                                  int32_t data_parallel_rank, KvEventEncoding encoding,
                                  const std::string& medium) {
  msgpack::sbuffer buf;
  Packer pk(buf);
  pk.pack_array(3);
  pk.pack_double(ts);
  pk.pack_array(static_cast<uint32_t>(events.size()));
  for (const kv::KvEvent& e : events) {
    if (encoding == KvEventEncoding::kMap) {
      pack_event_map(pk, e, medium);
    } else {
      pack_event_array(pk, e, medium);
    }
  }
  pk.pack_int32(data_parallel_rank);
  return std::string(buf.data(), buf.size());
}

bool kv_event_endpoint_binds(const std::string& endpoint) {
  return endpoint.find('*') != std::string::npos || endpoint.find("::") != std::string::npos ||
         endpoint.starts_with("ipc://") || endpoint.starts_with("inproc://");
}

Result<std::string> offset_endpoint_port(const std::string& endpoint, int32_t data_parallel_rank) {
  if (endpoint.empty() || data_parallel_rank == 0) return endpoint;
  if (endpoint.find("inproc") != std::string::npos) {
    return endpoint + "_dp" + std::to_string(data_parallel_rank);
  }
  if (endpoint.find("tcp") != std::string::npos) {
    const size_t colon = endpoint.rfind(':');
    if (colon == std::string::npos || colon + 1 >= endpoint.size()) return endpoint;
    const std::string port = endpoint.substr(colon + 1);
    if (port.find_first_not_of("0123456789") != std::string::npos || port.size() > 5) {
      return invalid_argument("kv events: endpoint %s: port '%s' cannot be offset by rank %d",
                              endpoint.c_str(), port.c_str(), data_parallel_rank);
    }
    return endpoint.substr(0, colon + 1) + std::to_string(std::stoi(port) + data_parallel_rank);
  }
  return invalid_argument("kv events: endpoint %s: must be tcp or inproc to offset by rank %d",
                          endpoint.c_str(), data_parallel_rank);
}

Status KvEventPublisherOptions::validate() const {
  const auto transport_ok = [](const std::string& e) {
    return e.starts_with("tcp://") || e.starts_with("ipc://") || e.starts_with("inproc://");
  };
  if (!transport_ok(endpoint)) {
    return invalid_argument("kv events: endpoint '%s' is not tcp://, ipc:// or inproc://",
                            endpoint.c_str());
  }
  if (!replay_endpoint.empty() && !transport_ok(replay_endpoint)) {
    return invalid_argument("kv events: replay endpoint '%s' is not tcp://, ipc:// or inproc://",
                            replay_endpoint.c_str());
  }
  if (data_parallel_rank < 0) {
    return invalid_argument("kv events: data_parallel_rank %d < 0", data_parallel_rank);
  }
  if (max_queue_batches < 1 || replay_buffer_batches < 0 || send_hwm < 0 ||
      shutdown_timeout_ms < 0) {
    return invalid_argument(
        "kv events: max_queue_batches %lld, replay_buffer_batches %lld, send_hwm %d, "
        "shutdown_timeout_ms %d",
        static_cast<long long>(max_queue_batches), static_cast<long long>(replay_buffer_batches),
        send_hwm, shutdown_timeout_ms);
  }
  if (medium.empty()) return invalid_argument("kv events: empty medium");
  return Status();
}

struct KvEventPublisher::Impl {
  zmq::context_t ctx{1};
  zmq::socket_t pub{ctx, zmq::socket_type::pub};
  std::optional<zmq::socket_t> replay;                 // ROUTER
  std::deque<std::pair<int64_t, std::string>> buffer;  // (seq, payload), oldest first
};

KvEventPublisher::KvEventPublisher(KvEventPublisherOptions options)
    : options_(std::move(options)), impl_(std::make_unique<Impl>()) {}

Result<std::unique_ptr<KvEventPublisher>> KvEventPublisher::create(
    KvEventPublisherOptions options) {
  if (Status s = options.validate(); !s.ok()) return s;
  Result<std::string> endpoint = offset_endpoint_port(options.endpoint, options.data_parallel_rank);
  if (!endpoint.ok()) return endpoint.status();
  Result<std::string> replay =
      offset_endpoint_port(options.replay_endpoint, options.data_parallel_rank);
  if (!replay.ok()) return replay.status();

  std::unique_ptr<KvEventPublisher> p(new KvEventPublisher(std::move(options)));
  Impl& impl = *p->impl_;
  try {
    impl.pub.set(zmq::sockopt::sndhwm, p->options_.send_hwm);
    impl.pub.set(zmq::sockopt::linger, p->options_.shutdown_timeout_ms);
    if (kv_event_endpoint_binds(*endpoint)) {
      impl.pub.bind(*endpoint);
      p->endpoint_ = impl.pub.get(zmq::sockopt::last_endpoint);
    } else {
      impl.pub.connect(*endpoint);
      p->endpoint_ = *endpoint;
    }
    if (!replay->empty()) {
      impl.replay.emplace(impl.ctx, zmq::socket_type::router);
      impl.replay->set(zmq::sockopt::linger, 0);
      impl.replay->bind(*replay);
      p->replay_endpoint_ = impl.replay->get(zmq::sockopt::last_endpoint);
    }
  } catch (const zmq::error_t& e) {
    return invalid_argument("kv events: endpoint %s (replay '%s'): %s", endpoint->c_str(),
                            replay->c_str(), e.what());
  }
  OSCAR_LOG_INFO(
      "kv events: publishing endpoint=%s mode=%s replay=%s topic='%s' encoding=%s dp_rank=%d "
      "max_queue_batches=%lld replay_buffer_batches=%lld",
      p->endpoint_.c_str(), kv_event_endpoint_binds(*endpoint) ? "bind" : "connect",
      p->replay_endpoint_.empty() ? "off" : p->replay_endpoint_.c_str(), p->options_.topic.c_str(),
      p->options_.encoding == KvEventEncoding::kMap ? "map" : "array",
      p->options_.data_parallel_rank, static_cast<long long>(p->options_.max_queue_batches),
      static_cast<long long>(p->options_.replay_buffer_batches));
  p->sender_ = std::thread([raw = p.get()] { raw->sender_loop(); });
  return p;
}

KvEventPublisher::~KvEventPublisher() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  if (sender_.joinable()) sender_.join();
  // impl_ closes the sockets (each lingers up to shutdown_timeout_ms) and terminates the context.
}

void KvEventPublisher::publish(std::vector<kv::KvEvent> events) {
  if (events.empty()) return;
  const double ts = wall_clock_seconds();
  {
    std::lock_guard<std::mutex> lk(mu_);
    OSCAR_CHECK(!stop_, "kv events: publish after shutdown");
    const int64_t seq = stats_.next_seq++;
    if (static_cast<int64_t>(queue_.size()) >= options_.max_queue_batches) {
      ++stats_.dropped_batches;
      stats_.dropped_events += static_cast<int64_t>(events.size());
      return;  // `events` is freed outside the sender's critical path
    }
    ++stats_.queued_batches;
    queue_.push_back(Pending{seq, ts, std::move(events)});
  }
  wake_.notify_one();
}

void KvEventPublisher::flush() {
  std::unique_lock<std::mutex> lk(mu_);
  drained_.wait(lk, [&] { return queue_.empty() && !in_flight_; });
}

int64_t KvEventPublisher::dropped_batches() const {
  std::lock_guard<std::mutex> lk(mu_);
  return stats_.dropped_batches;
}

KvEventPublisherStats KvEventPublisher::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return stats_;
}

void KvEventPublisher::sender_loop() {
  Impl& impl = *impl_;
  const std::string topic = options_.topic;
  const auto wait = impl.replay ? std::chrono::milliseconds(5) : std::chrono::milliseconds(100);
  int64_t dropped_logged = 0;
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    wake_.wait_for(lk, wait, [&] { return stop_ || !queue_.empty(); });
    std::deque<Pending> work;
    work.swap(queue_);
    in_flight_ = !work.empty();
    const bool stopping = stop_;
    const int64_t dropped = stats_.dropped_batches;
    lk.unlock();

    if (dropped > dropped_logged) {
      OSCAR_LOG_WARN("kv events: queue full, dropped_batches=%lld (sequence numbers gap)",
                     static_cast<long long>(dropped));
      dropped_logged = dropped;
    }
    int64_t sent = 0, errors = 0, replays = 0;
    for (Pending& b : work) {
      std::string payload = encode_kv_event_batch(b.ts, b.events, options_.data_parallel_rank,
                                                  options_.encoding, options_.medium);
      const std::string seq = seq_bytes(b.seq);
      try {
        // PUB never blocks: with no subscriber, or past the HWM, ZMQ drops the message.
        const auto more = zmq::send_flags::sndmore | zmq::send_flags::dontwait;
        impl.pub.send(zmq::buffer(topic), more);
        impl.pub.send(zmq::buffer(seq), more);
        impl.pub.send(zmq::buffer(payload), zmq::send_flags::dontwait);
        ++sent;
      } catch (const zmq::error_t& e) {
        ++errors;
        OSCAR_LOG_WARN("kv events: send seq=%lld failed: %s", static_cast<long long>(b.seq),
                       e.what());
      }
      if (options_.replay_buffer_batches > 0) {
        impl.buffer.emplace_back(b.seq, std::move(payload));
        while (static_cast<int64_t>(impl.buffer.size()) > options_.replay_buffer_batches) {
          impl.buffer.pop_front();
        }
      }
    }
    work.clear();  // frees the events off the lock

    // Replay: [identity, "", start seq (8 bytes BE)] -> [identity, "", seq, payload] for every
    // buffered batch with seq >= start, then [identity, "", -1 (8 bytes), ""].
    while (impl.replay) {
      std::vector<zmq::message_t> frames;
      std::optional<size_t> got;
      try {
        got = zmq::recv_multipart(*impl.replay, std::back_inserter(frames),
                                  zmq::recv_flags::dontwait);
      } catch (const zmq::error_t& e) {
        OSCAR_LOG_WARN("kv events: replay receive failed: %s", e.what());
        break;
      }
      if (!got) break;
      ++replays;
      if (frames.size() != 3 || frames[2].size() != 8) {
        OSCAR_LOG_WARN("kv events: invalid replay request (%zu frames)", frames.size());
        continue;
      }
      uint64_t start = 0;
      const auto* p = static_cast<const uint8_t*>(frames[2].data());
      for (int i = 0; i < 8; ++i) start = (start << 8) | p[i];
      const std::string identity = frames[0].to_string();
      const auto more = zmq::send_flags::sndmore | zmq::send_flags::dontwait;
      try {
        for (const auto& [seq, payload] : impl.buffer) {
          if (static_cast<uint64_t>(seq) < start) continue;
          impl.replay->send(zmq::buffer(identity), more);
          impl.replay->send(zmq::const_buffer(nullptr, 0), more);
          impl.replay->send(zmq::buffer(seq_bytes(seq)), more);
          impl.replay->send(zmq::buffer(payload), zmq::send_flags::dontwait);
        }
        impl.replay->send(zmq::buffer(identity), more);
        impl.replay->send(zmq::const_buffer(nullptr, 0), more);
        impl.replay->send(zmq::buffer(seq_bytes(-1)), more);
        impl.replay->send(zmq::const_buffer(nullptr, 0), zmq::send_flags::dontwait);
      } catch (const zmq::error_t& e) {
        OSCAR_LOG_WARN("kv events: replay send failed: %s", e.what());
      }
    }

    lk.lock();
    stats_.sent_batches += sent;
    stats_.send_errors += errors;
    stats_.replay_requests += replays;
    in_flight_ = false;
    if (queue_.empty()) drained_.notify_all();
    if (stopping && queue_.empty()) break;
  }
}

}  // namespace oscar::server
