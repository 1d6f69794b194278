// Chat, completions and responses on a session (openai_relay.h).
#include "server/openai_relay.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "server/openai_response.h"
#include "server/output_parser.h"

namespace oscar::server {

namespace {

using json = nlohmann::ordered_json;

// One response of n choices, each its own engine request.
class OpenAIRelay : public Relay {
 public:
  // One choice of the response: one engine request.
  struct Choice {
    std::string request_id;              // the engine request (response id, "-<i>" when n > 1)
    bool live = false;                   // submitted, terminal event not yet seen
    std::string text;                    // completions (non-streaming) and responses: text so far
    std::optional<OutputParser> parser;  // chat: tool calls and reasoning out of the text
    ChatOutput chat_out;                 // non-streaming chat: the answer so far
    int calls_sent = 0;                  // streaming chat: tool calls sent (their index)
    std::vector<LogprobEntry> logprobs;  // not yet sent (streaming) / all (non-streaming)
    int64_t text_offset = 0;             // bytes of the tokens so far (completions' text_offset)
    std::string finish_reason;
    int completion_tokens = 0;
    int cached_tokens = 0;
  };

  OpenAIRelay(HttpSession& s, const OpenAIRequest& req, int prompt_tokens);

  const ResponseMeta& meta() const { return meta_; }
  std::vector<Choice>& choices() { return choices_; }
  // The stream's opening events (the role chunk of each chat choice, response.created and the
  // rest of /v1/responses' opening), after the stream's head.
  void open_stream();

  void on_event(int choice, const engine::GenerationEvent& ev) override;
  void cancel() override;
  void fail(const ApiError& e, bool keep_alive) override;

 private:
  void on_finished(int i, const engine::GenerationEvent& ev);
  void relay_delta(int i, OutputDelta d, const std::string& finish_reason);
  void update_usage();
  json take_logprobs(Choice& c);
  void finish_response(const std::string& reason);
  void end_stream();

  HttpSession& session_;  // owns this relay
  ResponseMeta meta_;
  std::vector<Choice> choices_;
  const bool streaming_;
  const bool include_usage_;
  const int logprobs_;   // the request's logprobs (-1: none)
  std::string item_id_;  // responses: the output message item's id
  int seq_ = 0;          // responses: the next event's sequence_number
  Usage usage_;
};

OpenAIRelay::OpenAIRelay(HttpSession& s, const OpenAIRequest& req, int prompt_tokens)
    : session_(s),
      meta_{req.endpoint, make_response_id(req.endpoint), unix_now(), s.server().model_name,
            req.text_format},
      streaming_(req.stream),
      include_usage_(req.include_usage),
      logprobs_(req.logprobs),
      item_id_("msg_" + make_response_id(Endpoint::kCompletions).substr(5)),
      usage_{prompt_tokens, 0, 0} {
  const int n_choices = req.n;
  choices_.assign(n_choices, Choice{});
  for (int i = 0; i < n_choices; ++i) {
    Choice& c = choices_[i];
    c.request_id = n_choices == 1 ? meta_.id : str_format("%s-%d", meta_.id.c_str(), i);
    if (req.endpoint == Endpoint::kChatCompletions) {
      const bool tools = req.tools.is_array() && req.tool_choice != "none";
      const bool reasoning = s.server().options.reasoning_parser == "qwen3";
      c.parser.emplace(tools, reasoning);
      c.chat_out.with_reasoning = reasoning;
    }
  }
}

void OpenAIRelay::open_stream() {
  if (meta_.endpoint == Endpoint::kChatCompletions) {
    for (size_t i = 0; i < choices_.size(); ++i) {
      session_.queue_event(
          sse_event(stream_chunk(meta_, "", /*role_first=*/true, "", static_cast<int>(i))));
    }
  }
  if (meta_.endpoint == Endpoint::kResponses) {
    const json r = response_object(meta_, "in_progress", item_id_, "", usage_);
    session_.queue_event(response_event("response.created", json{{"response", r}}, &seq_));
    session_.queue_event(response_event("response.in_progress", json{{"response", r}}, &seq_));
    session_.queue_event(
        response_event("response.output_item.added",
                       json{{"output_index", 0},
                            {"item", response_message_item(item_id_, "in_progress", nullptr)}},
                       &seq_));
    session_.queue_event(response_event("response.content_part.added",
                                        json{{"item_id", item_id_},
                                             {"output_index", 0},
                                             {"content_index", 0},
                                             {"part", output_text_part("")}},
                                        &seq_));
  }
}

// One event of choice i (the engine request choices_[i].request_id).
void OpenAIRelay::on_event(int i, const engine::GenerationEvent& ev) {
  Choice& c = choices_[i];
  if (!c.live) return;
  usage_.prompt_tokens = ev.prompt_tokens > 0 ? ev.prompt_tokens : usage_.prompt_tokens;
  c.completion_tokens = ev.completion_tokens;
  c.cached_tokens = ev.cached_tokens;
  update_usage();
  switch (ev.kind) {
    case engine::GenerationEvent::kToken:
      if (ev.has_logprobs) {
        c.logprobs.push_back(LogprobEntry{ev.chosen, ev.top_logprobs, c.text_offset});
        c.text_offset += static_cast<int64_t>(ev.chosen.bytes.size());
      }
      if (meta_.endpoint == Endpoint::kResponses) {
        c.text += ev.text_delta;
        if (streaming_ && !ev.text_delta.empty() && !session_.client_gone()) {
          session_.queue_event(response_event("response.output_text.delta",
                                              {{"item_id", item_id_},
                                               {"output_index", 0},
                                               {"content_index", 0},
                                               {"delta", ev.text_delta}},
                                              &seq_));
          session_.flush();
        }
      } else if (c.parser) {
        relay_delta(i, c.parser->push(ev.text_delta), "");
      } else if (streaming_) {
        if ((!ev.text_delta.empty() || !c.logprobs.empty()) && !session_.client_gone()) {
          session_.queue_event(
              sse_event(stream_chunk(meta_, ev.text_delta, false, "", i, take_logprobs(c))));
          session_.flush();
        }
      } else {
        c.text += ev.text_delta;
      }
      return;
    case engine::GenerationEvent::kFinished:
      return on_finished(i, ev);
    case engine::GenerationEvent::kError: {
      c.live = false;
      cancel();  // the other choices: their events are ignored from now on
      session_.generation_ended();
      if (session_.client_gone()) return;
      return fail(error_from_status(ev.error, "generation failed"), session_.keep_alive());
    }
  }
}

void OpenAIRelay::on_finished(int i, const engine::GenerationEvent& ev) {
  Choice& c = choices_[i];
  c.live = false;
  std::string reason = ev.finish_reason;
  if (c.parser) {
    OutputDelta last = c.parser->finish();
    if (c.parser->tool_calls_seen() > 0 && reason == "stop") reason = "tool_calls";
    c.finish_reason = reason;
    if (!session_.client_gone()) relay_delta(i, std::move(last), streaming_ ? reason : "");
  } else {
    c.finish_reason = reason;
    if (streaming_ && !session_.client_gone() && meta_.endpoint != Endpoint::kResponses) {
      session_.queue_event(sse_event(stream_chunk(meta_, "", false, reason, i, take_logprobs(c))));
      session_.flush();
    }
  }
  for (const Choice& other : choices_)
    if (other.live) return;  // the response ends with its last choice
  session_.generation_ended();
  if (session_.client_gone()) return;
  if (meta_.endpoint == Endpoint::kResponses) return finish_response(choices_[0].finish_reason);
  if (streaming_) {
    if (include_usage_) session_.queue_event(sse_event(usage_chunk(meta_, usage_)));
    return end_stream();
  }
  json all = json::array();
  for (size_t k = 0; k < choices_.size(); ++k) {
    Choice& ck = choices_[k];
    if (meta_.endpoint == Endpoint::kChatCompletions) {
      all.push_back(
          chat_choice(static_cast<int>(k), ck.chat_out, ck.finish_reason, take_logprobs(ck)));
    } else {
      all.push_back(
          completion_choice(static_cast<int>(k), ck.text, ck.finish_reason, take_logprobs(ck)));
    }
  }
  session_.stop_watching();
  session_.send(200, dump_json(body_with_choices(meta_, std::move(all), usage_)),
                "application/json");
}

// A parsed chat delta of choice i: streamed as one chunk (with finish_reason when given, even if
// the delta is empty; with the log-probabilities of the tokens since the last chunk), or added
// to the whole answer.
void OpenAIRelay::relay_delta(int i, OutputDelta d, const std::string& finish_reason) {
  Choice& c = choices_[i];
  if (!streaming_) {
    c.chat_out.content += d.content;
    c.chat_out.reasoning += d.reasoning;
    for (ToolCall& call : d.tool_calls) c.chat_out.tool_calls.push_back(std::move(call));
    return;
  }
  if (session_.client_gone() || (d.empty() && finish_reason.empty() && c.logprobs.empty())) return;
  session_.queue_event(
      sse_event(chat_delta_chunk(meta_, d, c.calls_sent, finish_reason, i, take_logprobs(c))));
  c.calls_sent += static_cast<int>(d.tool_calls.size());
  session_.flush();
}

// Usage of the whole response: the prompt once, the completion tokens of every choice.
void OpenAIRelay::update_usage() {
  usage_.completion_tokens = 0;
  for (const Choice& c : choices_) usage_.completion_tokens += c.completion_tokens;
  usage_.cached_tokens = choices_.empty() ? 0 : choices_[0].cached_tokens;
}

// The choice's log-probabilities not yet sent, as the endpoint's JSON (null when the request
// asked for none), and forgets them.
json OpenAIRelay::take_logprobs(Choice& c) {
  if (logprobs_ < 0) return nullptr;
  json j = meta_.endpoint == Endpoint::kChatCompletions ? chat_logprobs_json(c.logprobs)
                                                        : completion_logprobs_json(c.logprobs);
  c.logprobs.clear();
  return j;
}

// Cancels every engine request of the response that is still live. Their terminal events still
// come (and end the response while the session is still generating, e.g. after a disconnect).
void OpenAIRelay::cancel() {
  for (const Choice& c : choices_)
    if (c.live) session_.server().engine->cancel(c.request_id);
}

// /v1/responses: the closing events, or the whole Response object.
void OpenAIRelay::finish_response(const std::string& reason) {
  const std::string status = response_status(reason);
  const std::string& text = choices_[0].text;
  json r = response_object(meta_, status, item_id_, text, usage_);
  if (!streaming_) {
    session_.stop_watching();
    return session_.send(200, dump_json(r), "application/json");
  }
  session_.queue_event(response_event(
      "response.output_text.done",
      json{{"item_id", item_id_}, {"output_index", 0}, {"content_index", 0}, {"text", text}},
      &seq_));
  session_.queue_event(response_event("response.content_part.done",
                                      json{{"item_id", item_id_},
                                           {"output_index", 0},
                                           {"content_index", 0},
                                           {"part", output_text_part(text)}},
                                      &seq_));
  session_.queue_event(response_event(
      "response.output_item.done",
      json{{"output_index", 0}, {"item", response_message_item(item_id_, "completed", &text)}},
      &seq_));
  session_.queue_event(
      response_event(status == "completed" ? "response.completed" : "response.incomplete",
                     json{{"response", r}}, &seq_));
  end_stream();
}

// An error in an open stream: an error event (chat/completions: a data line with the OpenAI
// error body; responses: an "error" event), then the end of the stream. Else an error body.
void OpenAIRelay::fail(const ApiError& e, bool keep_alive) {
  if (!streaming_) {
    session_.stop_watching();
    return session_.send_error(e, keep_alive);
  }
  if (meta_.endpoint == Endpoint::kResponses) {
    session_.queue_event(response_event("error",
                                        {{"code", e.code.empty() ? json(nullptr) : json(e.code)},
                                         {"message", e.message},
                                         {"param", nullptr}},
                                        &seq_));
  } else {
    session_.queue_event("data: " + e.to_json() + "\n\n");
  }
  end_stream();
}

// [DONE] (not for /v1/responses, whose stream ends with its last event), then the last chunk.
void OpenAIRelay::end_stream() {
  if (meta_.endpoint != Endpoint::kResponses) session_.queue_event(std::string(kSseDone));
  session_.end_stream();
}

}  // namespace

void start_openai_relay(HttpSession& s, Endpoint endpoint, const std::string& body) {
  HttpServer::State& st = s.server();
  engine::EngineInfo info = st.engine->info();
  if (!info.ready) return s.send_error(model_loading_error(), s.keep_alive());
  ParseResult parsed = parse_openai_request(endpoint, body, st.limits(info));
  if (auto* e = std::get_if<ApiError>(&parsed)) return s.send_error(*e, s.keep_alive());
  OpenAIRequest& req = std::get<OpenAIRequest>(parsed);

  std::vector<int32_t> prompt_ids;
  if (endpoint == Endpoint::kChatCompletions || endpoint == Endpoint::kResponses) {
    Result<std::vector<int32_t>> ids = st.engine->tokenize_chat(
        req.messages, req.tools, /*add_generation_prompt=*/true, req.chat_template_kwargs);
    if (!ids.ok()) {
      return s.send_error(error_from_status(ids.status(), "chat template"), s.keep_alive());
    }
    prompt_ids = std::move(ids).value();
  } else if (req.prompt_is_ids) {
    prompt_ids = std::move(req.prompt_ids);
  } else {
    Result<std::vector<int32_t>> ids = st.engine->tokenize(req.prompt_text);
    if (!ids.ok())
      return s.send_error(error_from_status(ids.status(), "tokenizer"), s.keep_alive());
    prompt_ids = std::move(ids).value();
  }
  auto fit = check_context_fit(static_cast<int>(prompt_ids.size()), req.max_tokens,
                               info.max_context_tokens, st.options.default_max_tokens);
  if (auto* e = std::get_if<ApiError>(&fit)) return s.send_error(*e, s.keep_alive());

  auto owned = std::make_unique<OpenAIRelay>(s, req, static_cast<int>(prompt_ids.size()));
  OpenAIRelay& relay = *owned;
  s.begin_relay(std::move(owned));
  std::vector<OpenAIRelay::Choice>& choices = relay.choices();

  engine::GenerationRequest greq;
  greq.prompt_ids = std::move(prompt_ids);
  greq.sampling = req.sampling;
  greq.max_tokens = std::get<int>(fit);
  greq.stop = std::move(req.stop);
  greq.ignore_eos = req.ignore_eos;
  greq.logprobs = req.logprobs;
  greq.tool_call_names = req.tool_call_names;
  greq.tool_call_on_start = req.tool_call_on_start;
  greq.json_object = req.json_object;
  greq.json_schema = req.json_schema;
  greq.tool_call_schemas = req.tool_call_schemas;
  for (size_t i = 0; i < choices.size(); ++i) {
    engine::GenerationRequest one = greq;
    one.request_id = choices[i].request_id;
    // Choice i draws with seed + i (vLLM's rule); unseeded choices get their own seeds from the
    // engine. Choices after the first share the first's prompt pages.
    if (one.sampling.has_seed) one.sampling.config.seed += static_cast<uint64_t>(i);
    if (i > 0) one.share_prompt_with = choices[0].request_id;
    Status submitted = st.engine->submit(std::move(one), s.event_callback(static_cast<int>(i)));
    if (!submitted.ok()) {
      relay.cancel();  // the choices already submitted (their events are ignored)
      choices.clear();
      return s.send_error(error_from_status(submitted, "engine"), s.keep_alive());
    }
    choices[i].live = true;
  }

  s.generation_started(relay.meta().id);
  if (req.stream) {
    s.open_event_stream();
    relay.open_stream();
    s.flush();
  }
}

}  // namespace oscar::server
