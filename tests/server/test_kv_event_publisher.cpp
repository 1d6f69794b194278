// KvEventPublisher against vLLM's KV-events wire format, with a C++ subscriber written for the
// test (cppzmq + msgpack-cxx) on 127.0.0.1 ephemeral ports:
//  - the msgpack bytes of a batch, field by field, in both encodings (tagged maps, vLLM since
//    #42892; tagged arrays, older vLLM), plus exact golden bytes for two small batches;
//  - the endpoint rules copied from vLLM (bind vs connect, data-parallel port offset);
//  - the scripted radix-cache workload (tests/kv/kv_event_workload.h) sent step by step: the
//    subscriber checks the topic frame, consecutive sequence numbers, ts and dp rank, fills any
//    gap (the slow-joiner start included) through the replay socket, decodes every event and
//    rebuilds exactly the block set the cache holds after every step;
//  - replay from a start sequence, from past the end, and from a small ring buffer;
//  - connect mode into a bound SUB (llm-d's topology), and a bound ipc:// socket (the README's
//    host-local example);
//  - a one-batch queue under a burst: every batch is either sent or counted as dropped, and the
//    sequence numbers the subscriber sees are exactly the sent ones, increasing.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <msgpack.hpp>
#include <thread>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "kv/kv_event_workload.h"
#include "server/kv_event_publisher.h"

namespace oscar::server {
namespace {

using kv::AllBlocksCleared;
using kv::BlockRemoved;
using kv::BlockStored;
using kv::KvEvent;

std::string str_of(const msgpack::object& o) {
  EXPECT_EQ(o.type, msgpack::type::STR);
  return o.type == msgpack::type::STR ? std::string(o.via.str.ptr, o.via.str.size) : "";
}

uint64_t uint_of(const msgpack::object& o) {
  EXPECT_EQ(o.type, msgpack::type::POSITIVE_INTEGER);
  return o.via.u64;
}

std::vector<uint64_t> uints_of(const msgpack::object& o) {
  std::vector<uint64_t> out;
  EXPECT_EQ(o.type, msgpack::type::ARRAY);
  if (o.type != msgpack::type::ARRAY) return out;
  for (uint32_t i = 0; i < o.via.array.size; ++i) out.push_back(uint_of(o.via.array.ptr[i]));
  return out;
}

std::optional<uint64_t> opt_uint_of(const msgpack::object& o) {
  if (o.type == msgpack::type::NIL) return std::nullopt;
  return uint_of(o);
}

std::vector<int32_t> tokens_of(const msgpack::object& o) {
  std::vector<int32_t> out;
  for (uint64_t u : uints_of(o)) out.push_back(static_cast<int32_t>(u));
  return out;
}

// One event as a router reads it: by field name (map) or by position (array).
KvEvent decode_event(const msgpack::object& o, const std::string& medium = "GPU") {
  if (o.type == msgpack::type::MAP) {
    std::map<std::string, msgpack::object> f;
    std::vector<std::string> order;
    for (uint32_t i = 0; i < o.via.map.size; ++i) {
      order.push_back(str_of(o.via.map.ptr[i].key));
      f[order.back()] = o.via.map.ptr[i].val;
    }
    EXPECT_EQ(order.at(0), "type");  // msgspec writes the tag first
    const std::string type = str_of(f.at("type"));
    if (type == "BlockStored") {
      EXPECT_EQ(order, (std::vector<std::string>{"type", "block_hashes", "parent_block_hash",
                                                 "token_ids", "block_size", "lora_id", "medium",
                                                 "lora_name", "group_idx", "kv_cache_spec_kind"}));
      EXPECT_EQ(f.at("lora_id").type, msgpack::type::NIL);
      EXPECT_EQ(f.at("lora_name").type, msgpack::type::NIL);
      EXPECT_EQ(str_of(f.at("medium")), medium);
      EXPECT_EQ(uint_of(f.at("group_idx")), 0u);
      EXPECT_EQ(str_of(f.at("kv_cache_spec_kind")), "full_attention");
      return BlockStored{uints_of(f.at("block_hashes")), opt_uint_of(f.at("parent_block_hash")),
                         tokens_of(f.at("token_ids")),
                         static_cast<int32_t>(uint_of(f.at("block_size")))};
    }
    if (type == "BlockRemoved") {
      EXPECT_EQ(order, (std::vector<std::string>{"type", "block_hashes", "medium", "group_idx"}));
      EXPECT_EQ(str_of(f.at("medium")), medium);
      return BlockRemoved{uints_of(f.at("block_hashes"))};
    }
    EXPECT_EQ(type, "AllBlocksCleared");
    EXPECT_EQ(o.via.map.size, 1u);
    return AllBlocksCleared{};
  }
  EXPECT_EQ(o.type, msgpack::type::ARRAY);
  const msgpack::object* a = o.via.array.ptr;
  const std::string type = str_of(a[0]);
  if (type == "BlockStored") {
    EXPECT_EQ(o.via.array.size, 8u);
    EXPECT_EQ(a[5].type, msgpack::type::NIL);  // lora_id
    EXPECT_EQ(str_of(a[6]), medium);
    EXPECT_EQ(a[7].type, msgpack::type::NIL);  // lora_name
    return BlockStored{uints_of(a[1]), opt_uint_of(a[2]), tokens_of(a[3]),
                       static_cast<int32_t>(uint_of(a[4]))};
  }
  if (type == "BlockRemoved") {
    EXPECT_EQ(o.via.array.size, 3u);
    EXPECT_EQ(str_of(a[2]), medium);
    return BlockRemoved{uints_of(a[1])};
  }
  EXPECT_EQ(type, "AllBlocksCleared");
  EXPECT_EQ(o.via.array.size, 1u);
  return AllBlocksCleared{};
}

struct DecodedBatch {
  double ts = 0;
  std::vector<KvEvent> events;
  int64_t dp_rank = -1;
};

DecodedBatch decode_batch(const std::string& payload) {
  DecodedBatch b;
  // The batch is an array of three, its ts a float64 (0xcb), as msgspec writes a Python float.
  EXPECT_GE(payload.size(), 10u);
  EXPECT_EQ(static_cast<uint8_t>(payload[0]), 0x93);
  EXPECT_EQ(static_cast<uint8_t>(payload[1]), 0xcb);
  msgpack::object_handle oh = msgpack::unpack(payload.data(), payload.size());
  const msgpack::object& o = oh.get();
  EXPECT_EQ(o.type, msgpack::type::ARRAY);
  EXPECT_EQ(o.via.array.size, 3u);
  if (o.type != msgpack::type::ARRAY || o.via.array.size != 3) return b;
  EXPECT_EQ(o.via.array.ptr[0].type, msgpack::type::FLOAT64);
  b.ts = o.via.array.ptr[0].via.f64;
  const msgpack::object& events = o.via.array.ptr[1];
  EXPECT_EQ(events.type, msgpack::type::ARRAY);
  for (uint32_t i = 0; i < events.via.array.size; ++i) {
    b.events.push_back(decode_event(events.via.array.ptr[i]));
  }
  b.dp_rank = static_cast<int64_t>(uint_of(o.via.array.ptr[2]));
  return b;
}

std::string be64(int64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i)
    s[static_cast<size_t>(i)] = static_cast<char>(static_cast<uint64_t>(v) >> (56 - 8 * i));
  return s;
}
int64_t from_be64(const zmq::message_t& m) {
  EXPECT_EQ(m.size(), 8u);
  uint64_t u = 0;
  const auto* p = static_cast<const uint8_t*>(m.data());
  for (size_t i = 0; i < 8 && i < m.size(); ++i) u = (u << 8) | p[i];
  return static_cast<int64_t>(u);
}

const std::vector<KvEvent> kSampleEvents = {
    BlockStored{{1, 0xFFFFFFFFFFFFFFF0ull}, std::nullopt, {1, 2, 300, 70000}, 2},
    BlockStored{{5}, 0xFFFFFFFFFFFFFFF0ull, {7, 8}, 2},
    BlockRemoved{{5, 1}},
    AllBlocksCleared{},
};

TEST(KvEventEncoding, MapBatchFieldByField) {
  const std::string payload =
      encode_kv_event_batch(1700000000.25, kSampleEvents, 3, KvEventEncoding::kMap, "GPU");
  const DecodedBatch b = decode_batch(payload);
  EXPECT_EQ(b.ts, 1700000000.25);
  EXPECT_EQ(b.dp_rank, 3);
  EXPECT_EQ(b.events, kSampleEvents);
}

TEST(KvEventEncoding, ArrayBatchFieldByField) {
  const std::string payload =
      encode_kv_event_batch(2.5, kSampleEvents, 0, KvEventEncoding::kArray, "GPU");
  const DecodedBatch b = decode_batch(payload);
  EXPECT_EQ(b.ts, 2.5);
  EXPECT_EQ(b.dp_rank, 0);
  EXPECT_EQ(b.events, kSampleEvents);
}

TEST(KvEventEncoding, GoldenBytes) {
  auto bytes = [](std::initializer_list<int> v) {
    std::string s;
    for (int b : v) s.push_back(static_cast<char>(b));
    return s;
  };
  // [0.5, [{"type": "AllBlocksCleared"}], 0]
  const std::string cleared = bytes({0x93, 0xcb, 0x3f, 0xe0, 0, 0, 0, 0, 0, 0, 0x91, 0x81, 0xa4}) +
                              "type" + bytes({0xb0}) + "AllBlocksCleared" + bytes({0x00});
  EXPECT_EQ(encode_kv_event_batch(0.5, std::vector<KvEvent>{AllBlocksCleared{}}, 0,
                                  KvEventEncoding::kMap, "GPU"),
            cleared);
  // [0.5, [["BlockRemoved", [2**63 + 1, 7], "GPU"]], 1]: a hash past int64 is a uint64 (0xcf),
  // a small one a positive fixint, exactly as msgspec writes Python ints.
  const std::string removed =
      bytes({0x93, 0xcb, 0x3f, 0xe0, 0, 0, 0, 0, 0, 0, 0x91, 0x93, 0xac}) + "BlockRemoved" +
      bytes({0x92, 0xcf, 0x80, 0, 0, 0, 0, 0, 0, 0x01, 0x07, 0xa3}) + "GPU" + bytes({0x01});
  EXPECT_EQ(encode_kv_event_batch(0.5, std::vector<KvEvent>{BlockRemoved{{(1ull << 63) + 1, 7}}}, 1,
                                  KvEventEncoding::kArray, "GPU"),
            removed);
}

TEST(KvEventEndpoints, VllmBindAndOffsetRules) {
  EXPECT_TRUE(kv_event_endpoint_binds("tcp://*:5557"));
  EXPECT_TRUE(kv_event_endpoint_binds("tcp://127.0.0.1:*"));
  EXPECT_TRUE(kv_event_endpoint_binds("tcp://[::]:5557"));
  EXPECT_TRUE(kv_event_endpoint_binds("ipc:///tmp/kv"));
  EXPECT_TRUE(kv_event_endpoint_binds("inproc://kv"));
  EXPECT_FALSE(kv_event_endpoint_binds("tcp://indexer.llm-d:5557"));
  EXPECT_EQ(offset_endpoint_port("tcp://*:5557", 0).value(), "tcp://*:5557");
  EXPECT_EQ(offset_endpoint_port("tcp://*:5557", 2).value(), "tcp://*:5559");
  EXPECT_EQ(offset_endpoint_port("tcp://host:5557", 1).value(), "tcp://host:5558");
  EXPECT_EQ(offset_endpoint_port("inproc://kv", 3).value(), "inproc://kv_dp3");
  EXPECT_FALSE(offset_endpoint_port("tcp://127.0.0.1:*", 1).ok());
  EXPECT_FALSE(offset_endpoint_port("ipc:///tmp/kv", 1).ok());
  KvEventPublisherOptions bad;
  bad.endpoint = "http://x:1";
  EXPECT_FALSE(KvEventPublisher::create(bad).ok());
  bad.endpoint = "tcp://127.0.0.1:*";
  bad.max_queue_batches = 0;
  EXPECT_FALSE(KvEventPublisher::create(bad).ok());
}

// The test's router: a SUB socket on the event stream and a DEALER on the replay socket (a REQ
// socket would accept only the first reply message of a replay).
class Subscriber {
 public:
  Subscriber(const std::string& endpoint, const std::string& replay_endpoint,
             const std::string& topic)
      : topic_(topic) {
    sub_.set(zmq::sockopt::subscribe, topic);
    sub_.connect(endpoint);
    if (!replay_endpoint.empty()) {
      replay_.set(zmq::sockopt::linger, 0);
      replay_.connect(replay_endpoint);
    }
  }

  // Receives (and replays) until batch `target` has been applied; every batch once, in order.
  void catch_up(int64_t target) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (last_ < target) {
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "stuck at seq " << last_;
      std::vector<zmq::message_t> frames;
      zmq::pollitem_t item{sub_.handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, std::chrono::milliseconds(100));
      if (!(item.revents & ZMQ_POLLIN)) {
        replay_from(last_ + 1);  // the tail was missed (e.g. before the subscription took)
        continue;
      }
      ASSERT_TRUE(zmq::recv_multipart(sub_, std::back_inserter(frames)));
      ASSERT_EQ(frames.size(), 3u);
      EXPECT_EQ(frames[0].to_string(), topic_);
      const int64_t seq = from_be64(frames[1]);
      ++n_live_;
      if (seq <= last_) continue;
      if (seq > last_ + 1) replay_from(last_ + 1);
      if (seq == last_ + 1) apply(seq, frames[2].to_string());
    }
  }

  // [seq, payload] pairs for every buffered batch with seq >= start, then the end marker.
  std::vector<std::pair<int64_t, std::string>> request_replay(int64_t start) {
    replay_.send(zmq::const_buffer(nullptr, 0), zmq::send_flags::sndmore);
    replay_.send(zmq::buffer(be64(start)), zmq::send_flags::none);
    std::vector<std::pair<int64_t, std::string>> out;
    for (;;) {
      zmq::pollitem_t item{replay_.handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, std::chrono::milliseconds(5000));
      EXPECT_TRUE(item.revents & ZMQ_POLLIN) << "no replay answer";
      if (!(item.revents & ZMQ_POLLIN)) break;
      std::vector<zmq::message_t> frames;
      EXPECT_TRUE(zmq::recv_multipart(replay_, std::back_inserter(frames)));
      EXPECT_EQ(frames.size(), 3u);  // "", seq, payload (the ROUTER's identity is stripped)
      if (frames.size() != 3) break;
      EXPECT_EQ(frames[0].size(), 0u);
      const int64_t seq = from_be64(frames[1]);
      if (seq == -1) {
        EXPECT_EQ(frames[2].size(), 0u);  // end marker
        break;
      }
      out.emplace_back(seq, frames[2].to_string());
    }
    return out;
  }

  kv::KvBlockMirror& mirror() { return mirror_; }
  const std::map<int64_t, std::string>& payloads() const { return payloads_; }
  int64_t n_replayed() const { return n_replayed_; }
  int64_t last() const { return last_; }
  int64_t n_live() const { return n_live_; }
  zmq::socket_t& sub() { return sub_; }

 private:
  void replay_from(int64_t start) {
    for (auto& [seq, payload] : request_replay(start)) {
      if (seq != last_ + 1) continue;
      ++n_replayed_;
      apply(seq, payload);
    }
  }
  void apply(int64_t seq, const std::string& payload) {
    const DecodedBatch b = decode_batch(payload);
    EXPECT_EQ(b.dp_rank, 0);
    EXPECT_GT(b.ts, 1.6e9);  // wall-clock seconds
    const Status s = mirror_.apply_all(b.events);
    EXPECT_TRUE(s.ok()) << "seq " << seq << ": " << s.to_string();
    payloads_[seq] = payload;
    last_ = seq;
  }

  zmq::context_t ctx_{1};
  zmq::socket_t sub_{ctx_, zmq::socket_type::sub};
  zmq::socket_t replay_{ctx_, zmq::socket_type::dealer};
  std::string topic_;
  kv::KvBlockMirror mirror_;
  std::map<int64_t, std::string> payloads_;
  int64_t last_ = -1;
  int64_t n_replayed_ = 0;
  int64_t n_live_ = 0;
};

KvEventPublisherOptions loopback_options() {
  KvEventPublisherOptions o;
  o.endpoint = "tcp://127.0.0.1:*";
  o.replay_endpoint = "tcp://127.0.0.1:*";
  o.topic = "kv@pod-a@tiny-qwen3";
  return o;
}

TEST(KvEventPublisher, ScriptedWorkloadOverZmqRebuildsTheCacheAfterEveryStep) {
  auto pub = KvEventPublisher::create(loopback_options());
  ASSERT_TRUE(pub.ok()) << pub.status().to_string();
  KvEventPublisher& p = **pub;
  ASSERT_TRUE(p.endpoint().starts_with("tcp://127.0.0.1:")) << p.endpoint();
  ASSERT_NE(p.endpoint(), p.replay_endpoint());
  Subscriber sub(p.endpoint(), p.replay_endpoint(), p.options().topic);

  kv::testing::KvEventWorkload w;
  int64_t seq = -1;
  p.publish(w.take_attach_events());  // AllBlocksCleared: a fresh replica
  sub.catch_up(++seq);
  int n_steps = 0;
  w.run([&](const std::string& step, std::vector<KvEvent> events) {
    SCOPED_TRACE(step);
    ++n_steps;
    if (events.empty()) return;  // D, the cancelled request: nothing to publish
    p.publish(std::move(events));
    sub.catch_up(++seq);
    EXPECT_EQ(kv::testing::mirrored_blocks(sub.mirror()), kv::testing::expected_blocks(w.cache()));
  });
  EXPECT_EQ(n_steps, 9);
  p.flush();
  const KvEventPublisherStats st = p.stats();
  EXPECT_EQ(st.next_seq, seq + 1);
  EXPECT_EQ(st.sent_batches, seq + 1);
  EXPECT_EQ(st.dropped_batches, 0);
  EXPECT_EQ(st.send_errors, 0);

  // Replay: everything from 0, byte-identical to what the subscriber applied; a suffix; nothing
  // past the end (only the end marker).
  const auto all = sub.request_replay(0);
  ASSERT_EQ(static_cast<int64_t>(all.size()), seq + 1);
  for (size_t i = 0; i < all.size(); ++i) {
    EXPECT_EQ(all[i].first, static_cast<int64_t>(i));
    EXPECT_EQ(all[i].second, sub.payloads().at(static_cast<int64_t>(i)));
  }
  const auto tail = sub.request_replay(seq - 1);
  ASSERT_EQ(tail.size(), 2u);
  EXPECT_EQ(tail[0].first, seq - 1);
  EXPECT_TRUE(sub.request_replay(seq + 5).empty());
  // The sender thread counts a request after answering it: wait for the count, briefly.
  for (int i = 0; i < 200 && p.stats().replay_requests < 3; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_GE(p.stats().replay_requests, 3);
}

TEST(KvEventPublisher, ReplayBufferKeepsTheLastBatches) {
  KvEventPublisherOptions o = loopback_options();
  o.replay_buffer_batches = 3;
  auto pub = KvEventPublisher::create(o);
  ASSERT_TRUE(pub.ok()) << pub.status().to_string();
  for (uint64_t i = 0; i < 10; ++i) (*pub)->publish({BlockRemoved{{i}}});
  (*pub)->flush();
  Subscriber sub((*pub)->endpoint(), (*pub)->replay_endpoint(), o.topic);
  const auto got = sub.request_replay(0);
  ASSERT_EQ(got.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(got[i].first, static_cast<int64_t>(7 + i));
    EXPECT_EQ(decode_batch(got[i].second).events, std::vector<KvEvent>{BlockRemoved{{7 + i}}});
  }
}

TEST(KvEventPublisher, ConnectsToABoundSubscriber) {
  // llm-d's topology: the indexer binds SUB, each replica's PUB connects to it.
  zmq::context_t ctx(1);
  zmq::socket_t sub(ctx, zmq::socket_type::sub);
  sub.set(zmq::sockopt::subscribe, "");
  sub.bind("tcp://127.0.0.1:*");
  const std::string bound = sub.get(zmq::sockopt::last_endpoint);
  KvEventPublisherOptions o;
  o.endpoint = bound;  // no "*": connect
  o.topic = "kv@pod-b@m";
  o.encoding = KvEventEncoding::kArray;
  auto pub = KvEventPublisher::create(o);
  ASSERT_TRUE(pub.ok()) << pub.status().to_string();
  EXPECT_EQ((*pub)->endpoint(), bound);
  // PUB drops until the connection is up: publish until one arrives.
  int64_t published = 0;
  std::vector<zmq::message_t> frames;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (frames.empty() && std::chrono::steady_clock::now() < deadline) {
    (*pub)->publish({AllBlocksCleared{}});
    ++published;
    zmq::pollitem_t item{sub.handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, std::chrono::milliseconds(50));
    if (item.revents & ZMQ_POLLIN) {
      ASSERT_TRUE(zmq::recv_multipart(sub, std::back_inserter(frames)));
    }
  }
  ASSERT_EQ(frames.size(), 3u);
  EXPECT_EQ(frames[0].to_string(), "kv@pod-b@m");
  EXPECT_LT(from_be64(frames[1]), published);
  EXPECT_EQ(decode_batch(frames[2].to_string()).events, std::vector<KvEvent>{AllBlocksCleared{}});
}

// The README's example: an ipc:// endpoint binds a socket only this host reaches, and a
// subscriber on it receives the batches.
TEST(KvEventPublisher, BindsAnIpcSocket) {
  const std::string path = "/tmp/oscar-kv-events-test-" + std::to_string(getpid());
  KvEventPublisherOptions o;
  o.endpoint = "ipc://" + path;
  o.topic = "kv@pod-c@m";
  EXPECT_TRUE(kv_event_endpoint_binds(o.endpoint));
  auto pub = KvEventPublisher::create(o);
  ASSERT_TRUE(pub.ok()) << pub.status().to_string();
  EXPECT_EQ((*pub)->endpoint(), o.endpoint);
  zmq::context_t ctx(1);
  zmq::socket_t sub(ctx, zmq::socket_type::sub);
  sub.set(zmq::sockopt::subscribe, "");
  sub.connect(o.endpoint);
  std::vector<zmq::message_t> frames;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (frames.empty() && std::chrono::steady_clock::now() < deadline) {
    (*pub)->publish({AllBlocksCleared{}});  // PUB drops until the subscription is up
    zmq::pollitem_t item{sub.handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, std::chrono::milliseconds(50));
    if (item.revents & ZMQ_POLLIN) {
      ASSERT_TRUE(zmq::recv_multipart(sub, std::back_inserter(frames)));
    }
  }
  ASSERT_EQ(frames.size(), 3u);
  EXPECT_EQ(frames[0].to_string(), "kv@pod-c@m");
  EXPECT_EQ(decode_batch(frames[2].to_string()).events, std::vector<KvEvent>{AllBlocksCleared{}});
  (*pub).reset();  // closes the socket
  std::remove(path.c_str());
}

TEST(KvEventPublisher, FullQueueDropsAndCountsAndTheGapIsVisible) {
  KvEventPublisherOptions o = loopback_options();
  o.max_queue_batches = 1;
  auto pub = KvEventPublisher::create(o);
  ASSERT_TRUE(pub.ok()) << pub.status().to_string();
  constexpr int64_t kBurst = 5000;
  for (int64_t i = 0; i < kBurst; ++i) {
    (*pub)->publish({BlockRemoved{{static_cast<uint64_t>(i)}}});
  }
  (*pub)->flush();
  const KvEventPublisherStats st = (*pub)->stats();
  EXPECT_EQ(st.next_seq, kBurst);
  EXPECT_EQ(st.queued_batches + st.dropped_batches, kBurst);
  EXPECT_EQ(st.dropped_events, st.dropped_batches);
  EXPECT_EQ(st.sent_batches, st.queued_batches);
  EXPECT_EQ((*pub)->dropped_batches(), st.dropped_batches);  // what the scheduler polls
  // The replay buffer (10000) holds every sent batch: exactly queued_batches of them, with
  // increasing sequence numbers, each batch's event naming its own sequence number.
  Subscriber sub((*pub)->endpoint(), (*pub)->replay_endpoint(), o.topic);
  const auto got = sub.request_replay(0);
  ASSERT_EQ(static_cast<int64_t>(got.size()), st.queued_batches);
  for (size_t i = 0; i < got.size(); ++i) {
    if (i > 0) {
      EXPECT_GT(got[i].first, got[i - 1].first);
    }
    EXPECT_EQ(decode_batch(got[i].second).events,
              std::vector<KvEvent>{BlockRemoved{{static_cast<uint64_t>(got[i].first)}}});
  }
  std::printf("burst of %lld: %lld sent, %lld dropped\n", static_cast<long long>(kBurst),
              static_cast<long long>(st.sent_batches), static_cast<long long>(st.dropped_batches));
}

}  // namespace
}  // namespace oscar::server
