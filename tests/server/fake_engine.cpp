#include "tests/server/fake_engine.h"

#include <algorithm>
#include <utility>

#include "core/status.h"

namespace oscar::server::testing {

using Clock = std::chrono::steady_clock;
using OnEvent = std::function<void(const engine::GenerationEvent&)>;

struct FakeEngine::Live {
  engine::GenerationRequest req;
  std::shared_ptr<OnEvent> on_event;
  bool cancelled = false;
  int n_generated = 0;
  std::string text;        // decoded output so far (whole UTF-8 characters)
  std::string held_bytes;  // bytes of an incomplete UTF-8 character
  size_t emitted = 0;      // bytes of text already sent as deltas
  int64_t pages = 0;
  Clock::time_point arrived = Clock::now();
  Clock::time_point last_token;
};

namespace {

// 1: complete character(s), 0: a valid but incomplete prefix, -1: invalid.
int utf8_state(const std::string& s) {
  auto b0 = static_cast<unsigned char>(s[0]);
  size_t len = b0 < 0x80 ? 1 : (b0 >> 5) == 0x6 ? 2 : (b0 >> 4) == 0xE ? 3 : (b0 >> 3) == 0x1E ? 4 : 0;
  if (len == 0) return -1;
  for (size_t i = 1; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) return -1;
  }
  if (s.size() < len) return 0;
  return s.size() == len ? 1 : -1;
}

void observe(engine::Histogram* h, double seconds) {
  size_t i = 0;
  while (i < h->upper_bounds.size() && seconds > h->upper_bounds[i]) ++i;
  ++h->counts[i];
  h->sum += seconds;
}

engine::Histogram make_histogram() {
  engine::Histogram h;
  h.upper_bounds = {0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0};
  h.counts.assign(h.upper_bounds.size() + 1, 0);
  return h;
}

// Length of the longest suffix of text that is a proper prefix of a stop string.
size_t stop_prefix_suffix(const std::string& text, const std::vector<std::string>& stops) {
  size_t best = 0;
  for (const std::string& s : stops) {
    for (size_t k = std::min(s.size() - 1, text.size()); k > best; --k) {
      if (text.compare(text.size() - k, k, s, 0, k) == 0) {
        best = k;
        break;
      }
    }
  }
  return best;
}

}  // namespace

FakeEngine::FakeEngine(Options options)
    : opt_(std::move(options)), ready_(opt_.ready), ttft_(make_histogram()),
      tpot_(make_histogram()) {
  thread_ = std::thread([this] { worker(); });
}

FakeEngine::~FakeEngine() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    quit_ = true;
    for (auto& l : live_) l->cancelled = true;
  }
  cv_.notify_all();
  thread_.join();
}

Status FakeEngine::submit(engine::GenerationRequest req, OnEvent on_event) {
  const int n_prompt = static_cast<int>(req.prompt_ids.size());
  if (n_prompt == 0) return invalid_argument("fake engine: empty prompt");
  if (req.max_tokens <= 0) return invalid_argument("fake engine: max_tokens %d", req.max_tokens);
  if (n_prompt + req.max_tokens > opt_.max_context_tokens) {
    return out_of_range("fake engine: %d prompt + %d completion tokens > context %d", n_prompt,
                        req.max_tokens, opt_.max_context_tokens);
  }
  for (int32_t id : req.prompt_ids) {
    if (id < 0 || id >= opt_.vocab_size) return invalid_argument("fake engine: token id %d", id);
  }
  auto live = std::make_unique<Live>();
  live->on_event = std::make_shared<OnEvent>(std::move(on_event));
  live->pages = (n_prompt + opt_.page_size_tokens - 1) / opt_.page_size_tokens;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& l : live_) {
      if (l->req.request_id == req.request_id) {
        return invalid_argument("fake engine: duplicate request id '%s'", req.request_id.c_str());
      }
    }
    if (pages_used_ + live->pages > opt_.pages_total) {
      return resource_exhausted("fake engine: out of pages");
    }
    pages_used_ += live->pages;
    prompt_tokens_total_ += n_prompt;
    submitted_.push_back(req);
    live->req = std::move(req);
    live_.push_back(std::move(live));
  }
  cv_.notify_all();
  return Status();
}

void FakeEngine::cancel(const std::string& request_id) {
  ++cancel_calls_;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& l : live_) {
    if (l->req.request_id == request_id) l->cancelled = true;
  }
}

engine::EngineInfo FakeEngine::info() const {
  engine::EngineInfo info;
  info.model_name = opt_.model_name;
  info.max_context_tokens = opt_.max_context_tokens;
  info.vocab_size = opt_.vocab_size;
  info.ready = ready_;
  return info;
}

engine::EngineMetrics FakeEngine::metrics() const {
  std::lock_guard<std::mutex> lock(mu_);
  engine::EngineMetrics m;
  m.requests_running = static_cast<int>(live_.size());
  m.requests_waiting = 0;
  m.prompt_tokens_total = prompt_tokens_total_;
  m.generation_tokens_total = generation_tokens_total_;
  m.kv_pools.push_back({"bf16", pages_used_, opt_.pages_total});
  m.kv_pools.push_back({"int2", 0, opt_.pages_total * 4});
  m.prefix_cache_hit_rate = 0.0;
  m.kv_effective_bits_per_element = 2.25;
  m.time_to_first_token_seconds = ttft_;
  m.time_per_output_token_seconds = tpot_;
  return m;
}

Result<std::vector<int32_t>> FakeEngine::tokenize(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size());
  for (char c : text) ids.push_back(static_cast<unsigned char>(c));
  return ids;
}

Result<std::string> FakeEngine::apply_chat_template(const nlohmann::ordered_json& messages,
                                                    const nlohmann::ordered_json& tools,
                                                    bool add_generation_prompt,
                                                    const nlohmann::ordered_json& kwargs) const {
  std::string out;
  if (tools.is_array()) out += "<|tools|>" + std::to_string(tools.size()) + "\n";
  for (const auto& m : messages) {
    out += "<|" + m.at("role").get<std::string>() + "|>";
    auto c = m.find("content");
    if (c != m.end() && c->is_string()) {
      out += c->get<std::string>();
    } else if (c != m.end() && c->is_array()) {
      for (const auto& part : *c) {
        if (part.is_object() && part.contains("text") && part["text"].is_string()) {
          out += part["text"].get<std::string>();
        } else {
          return invalid_argument("fake template: content parts must be {\"text\": string}");
        }
      }
    }
    out += "\n";
  }
  if (add_generation_prompt) out += "<|assistant|>";
  if (kwargs.is_object() && kwargs.value("enable_thinking", true) == false) out += "<nothink>";
  return out;
}

Result<std::vector<int32_t>> FakeEngine::tokenize_chat(const nlohmann::ordered_json& messages,
                                                      const nlohmann::ordered_json& tools,
                                                      bool add_generation_prompt,
                                                      const nlohmann::ordered_json& kwargs) const {
  if (!opt_.has_chat_template) {
    return Status(StatusCode::kInternal, "the model has no chat template");
  }
  OSCAR_ASSIGN_OR_RETURN(std::string text,
                         apply_chat_template(messages, tools, add_generation_prompt, kwargs));
  if (opt_.chat_prompt_is_last_content && !messages.empty() &&
      messages.back().value("content", nlohmann::ordered_json()).is_string()) {
    text = messages.back()["content"].get<std::string>();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    last_chat_ = messages;
  }
  return tokenize(text);
}

nlohmann::ordered_json FakeEngine::last_chat() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_chat_;
}

int64_t FakeEngine::pages_used() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pages_used_;
}

int FakeEngine::live_requests() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(live_.size());
}

std::vector<engine::GenerationRequest> FakeEngine::submitted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return submitted_;
}

void FakeEngine::worker() {
  using Delivery = std::pair<std::shared_ptr<OnEvent>, engine::GenerationEvent>;
  while (true) {
    std::vector<Delivery> out;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return quit_ || !live_.empty(); });
      if (quit_ && live_.empty()) return;
      const Clock::time_point now = Clock::now();
      for (auto it = live_.begin(); it != live_.end();) {
        Live& l = **it;
        engine::GenerationEvent ev;
        const int n_prompt = static_cast<int>(l.req.prompt_ids.size());
        ev.prompt_tokens = n_prompt;
        std::string finish;
        if (l.cancelled) {
          finish = "cancelled";
          ++cancelled_requests_;
        } else {
          const int32_t id = l.req.prompt_ids[l.n_generated % n_prompt];
          ++l.n_generated;
          ++generation_tokens_total_;
          if (l.n_generated == 1) {
            observe(&ttft_, std::chrono::duration<double>(now - l.arrived).count());
          } else {
            observe(&tpot_, std::chrono::duration<double>(now - l.last_token).count());
          }
          l.last_token = now;
          if (id < 256) {
            l.held_bytes += static_cast<char>(id);
            int state = utf8_state(l.held_bytes);
            if (state != 0) {
              l.text += state == 1 ? l.held_bytes : std::string("\xEF\xBF\xBD");
              l.held_bytes.clear();
            }
          } else {
            l.text += "<" + std::to_string(id) + ">";
          }
          // Stop strings first, then EOS / length.
          size_t stop_at = std::string::npos;
          for (const std::string& s : l.req.stop) stop_at = std::min(stop_at, l.text.find(s));
          size_t end = l.text.size() - stop_prefix_suffix(l.text, l.req.stop);
          if (stop_at != std::string::npos) {
            end = stop_at;
            finish = "stop";
          } else if (!l.req.ignore_eos && l.n_generated >= n_prompt) {
            end = l.text.size();
            finish = "stop";
          } else if (l.n_generated >= l.req.max_tokens) {
            end = l.text.size();
            finish = "length";
          }
          ev.kind = engine::GenerationEvent::kToken;
          ev.token_id = id;
          if (l.req.logprobs >= 0) {
            // Scripted values: the token has logprob -0.25; alternative k is token id + k with
            // logprob -0.25 * (k + 1).
            auto bytes = [](int32_t t) {
              return t < 256 ? std::string(1, static_cast<char>(t)) : "<" + std::to_string(t) + ">";
            };
            ev.has_logprobs = true;
            ev.chosen = engine::TokenLogprob{id, bytes(id), -0.25f};
            for (int k = 0; k < l.req.logprobs; ++k)
              ev.top_logprobs.push_back(
                  engine::TokenLogprob{id + k, bytes(id + k), -0.25f * static_cast<float>(k + 1)});
          }
          if (end > l.emitted) ev.text_delta = l.text.substr(l.emitted, end - l.emitted);
          l.emitted = std::max(l.emitted, end);
          ev.completion_tokens = l.n_generated;
          out.emplace_back(l.on_event, ev);
          const int64_t need =
              (n_prompt + l.n_generated + opt_.page_size_tokens - 1) / opt_.page_size_tokens;
          pages_used_ += need - l.pages;
          l.pages = need;
        }
        if (finish.empty()) {
          ++it;
          continue;
        }
        engine::GenerationEvent done;
        done.kind = engine::GenerationEvent::kFinished;
        done.finish_reason = finish;
        done.prompt_tokens = n_prompt;
        done.completion_tokens = l.n_generated;
        out.emplace_back(l.on_event, done);
        pages_used_ -= l.pages;
        it = live_.erase(it);
      }
    }
    for (auto& [cb, ev] : out) (*cb)(ev);
    out.clear();  // terminal callbacks are destroyed here, outside the lock
    std::this_thread::sleep_for(opt_.token_delay);
  }
}

}  // namespace oscar::server::testing
