// /v1/generate and /v1/abort on a session (generate_relay.h).
#include "server/generate_relay.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/log.h"
#include "server/generate_endpoint.h"
#include "server/openai_response.h"

namespace oscar::server {

namespace {

// One /v1/generate request: its output ids so far, relayed as they come or answered whole.
class GenerateRelay : public Relay {
 public:
  GenerateRelay(HttpSession& s, std::string request_id, const GenerateRequest& req)
      : session_(s),
        request_id_(std::move(request_id)),
        streaming_(req.stream),
        stop_token_ids_(req.stop_token_ids),
        usage_{static_cast<int>(req.input_ids.size()), 0, 0} {}

  void on_event(int /*choice*/, const engine::GenerationEvent& ev) override;
  void cancel() override { session_.server().engine->cancel(request_id_); }
  void fail(const ApiError& e, bool keep_alive) override;

 private:
  HttpSession& session_;  // owns this relay
  const std::string request_id_;
  const bool streaming_;
  const std::vector<int32_t> stop_token_ids_;
  std::vector<int32_t> output_ids_;
  bool stopped_by_token_ = false;  // a stop_token_ids token was seen: later tokens are not ours
  Usage usage_;
};

void GenerateRelay::on_event(int, const engine::GenerationEvent& ev) {
  usage_.prompt_tokens = ev.prompt_tokens > 0 ? ev.prompt_tokens : usage_.prompt_tokens;
  usage_.cached_tokens = ev.cached_tokens;
  switch (ev.kind) {
    case engine::GenerationEvent::kToken: {
      // After a stop token: the engine was told to cancel; later tokens are not ours.
      if (stopped_by_token_ || ev.token_id < 0) return;
      output_ids_.push_back(ev.token_id);
      usage_.completion_tokens = static_cast<int>(output_ids_.size());
      if (std::find(stop_token_ids_.begin(), stop_token_ids_.end(), ev.token_id) !=
          stop_token_ids_.end()) {
        stopped_by_token_ = true;
        session_.server().engine->cancel(request_id_);
      }
      if (streaming_ && !session_.client_gone()) {
        session_.queue_event(sse_event(generate_chunk(request_id_, {ev.token_id}, "", 0, 0, 0)));
        session_.flush();
      }
      return;
    }
    case engine::GenerationEvent::kFinished: {
      session_.generation_ended();
      if (session_.client_gone()) return;
      const std::string reason = stopped_by_token_ ? "stop" : ev.finish_reason;
      if (streaming_) {
        session_.queue_event(
            sse_event(generate_chunk(request_id_, {}, reason, usage_.prompt_tokens,
                                     usage_.completion_tokens, usage_.cached_tokens)));
        session_.queue_event(std::string(kSseDone));
        return session_.end_stream();
      }
      session_.stop_watching();
      return session_.send(
          200,
          dump_json(generate_body(request_id_, output_ids_, reason, usage_.prompt_tokens,
                                  usage_.completion_tokens, usage_.cached_tokens)),
          "application/json");
    }
    case engine::GenerationEvent::kError: {
      session_.generation_ended();
      if (session_.client_gone()) return;
      return fail(error_from_status(ev.error, "generation failed"), session_.keep_alive());
    }
  }
}

// In a stream: a data line with the OpenAI error body, then [DONE], as on /v1/completions.
void GenerateRelay::fail(const ApiError& e, bool keep_alive) {
  if (streaming_) {
    session_.queue_event("data: " + e.to_json() + "\n\n");
    session_.queue_event(std::string(kSseDone));
    return session_.end_stream();
  }
  session_.stop_watching();
  session_.send_error(e, keep_alive);
}

}  // namespace

void start_generate_relay(HttpSession& s, const std::string& body) {
  HttpServer::State& st = s.server();
  engine::EngineInfo info = st.engine->info();
  if (!info.ready) return s.send_error(model_loading_error(), s.keep_alive());
  auto parsed = parse_generate_request(body, st.limits(info));
  if (auto* e = std::get_if<ApiError>(&parsed)) return s.send_error(*e, s.keep_alive());
  GenerateRequest& req = std::get<GenerateRequest>(parsed);
  auto fit = check_context_fit(static_cast<int>(req.input_ids.size()), req.max_tokens,
                               info.max_context_tokens);
  if (auto* e = std::get_if<ApiError>(&fit)) return s.send_error(*e, s.keep_alive());
  const std::string id = req.request_id.empty() ? make_generate_id() : req.request_id;
  std::shared_ptr<GenerateRegistry> registry = st.generate_ids;
  if (!registry->add(id)) {
    ApiError e = invalid_request(
        str_format("a request with request_id '%s' is already running", id.c_str()), "request_id");
    e.code = "duplicate_request_id";
    return s.send_error(e, s.keep_alive());
  }

  s.begin_relay(std::make_unique<GenerateRelay>(s, id, req));

  engine::GenerationRequest greq;
  greq.request_id = id;
  greq.prompt_ids = std::move(req.input_ids);
  greq.sampling = req.sampling;
  greq.max_tokens = std::get<int>(fit);
  greq.ignore_eos = req.ignore_eos;

  Status submitted = st.engine->submit(
      std::move(greq),
      [registry, id, to_session = s.event_callback(0)](const engine::GenerationEvent& ev) {
        // The id leaves the registry with the terminal event, whatever became of the session.
        if (ev.kind != engine::GenerationEvent::kToken) registry->remove(id);
        to_session(ev);
      });
  if (!submitted.ok()) {
    registry->remove(id);
    return s.send_error(error_from_status(submitted, "engine"), s.keep_alive());
  }
  s.generation_started(id);
  if (req.stream) {
    s.open_event_stream();
    s.flush();
  }
}

void abort_generate(HttpSession& s, const std::string& body) {
  HttpServer::State& st = s.server();
  auto parsed = parse_abort_request(body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return s.send_error(*e, s.keep_alive());
  const std::string& id = std::get<std::string>(parsed);
  if (!st.generate_ids->contains(id)) {
    ApiError e = invalid_request(
        str_format("no running /v1/generate request has request_id '%s'", id.c_str()), "request_id",
        404);
    e.code = "request_not_found";
    return s.send_error(e, s.keep_alive());
  }
  st.engine->cancel(id);
  OSCAR_LOG_INFO("server: abort request_id=%s", id.c_str());
  s.send(200, dump_json(nlohmann::ordered_json{{"request_id", id}, {"aborted", true}}),
         "application/json");
}

}  // namespace oscar::server
