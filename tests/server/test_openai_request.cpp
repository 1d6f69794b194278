// Table tests for the OpenAI request parser: every rejection names its field and carries the
// right HTTP status; accepted requests fill OpenAIRequest as documented in openai_request.h.
#include "server/openai_request.h"

#include <string>

#include <gtest/gtest.h>

#include "server/openai_response.h"

namespace oscar::server {
namespace {

const ModelLimits kLimits{"m", /*max_context_tokens=*/100, /*vocab_size=*/50};

ParseResult chat(const std::string& body) {
  return parse_openai_request(Endpoint::kChatCompletions, body, kLimits);
}
ParseResult completion(const std::string& body) {
  return parse_openai_request(Endpoint::kCompletions, body, kLimits);
}

struct BadCase {
  const char* name;
  Endpoint endpoint;
  std::string body;
  int status;
  const char* param;         // expected ApiError::param
  const char* message_part;  // a substring the message must contain
};

const std::string kMsgs = R"("messages":[{"role":"user","content":"hi"}])";

std::vector<BadCase> bad_cases() {
  const Endpoint C = Endpoint::kChatCompletions, P = Endpoint::kCompletions,
                 R = Endpoint::kResponses;
  std::string deep = R"({"model":"m","x":)" + std::string(65, '[') + std::string(65, ']') + "}";
  return {
      {"malformed_json", C, R"({"model":"m",)", 400, "", "not valid JSON"},
      {"not_an_object", C, R"([1,2])", 400, "", "JSON object"},
      {"invalid_utf8", C, "{\"model\":\"m\xff\"," + kMsgs + "}", 400, "", "not valid JSON"},
      {"deep_nesting", C, deep, 400, "", "deeper than 64"},
      {"model_missing", C, "{" + kMsgs + "}", 400, "model", "required"},
      {"model_wrong_type", C, R"({"model":3,)" + kMsgs + "}", 400, "model", "must be a string"},
      {"model_unknown", C, R"({"model":"gpt-9",)" + kMsgs + "}", 404, "model", "gpt-9"},
      {"messages_missing", C, R"({"model":"m"})", 400, "messages", "required"},
      {"messages_empty", C, R"({"model":"m","messages":[]})", 400, "messages", "empty"},
      {"messages_wrong_type", C, R"({"model":"m","messages":"hi"})", 400, "messages", "array"},
      {"message_not_object", C, R"({"model":"m","messages":[1]})", 400, "messages[0]", "object"},
      {"message_no_role", C, R"({"model":"m","messages":[{"content":"x"}]})", 400,
       "messages[0].role", "required"},
      {"message_role_type", C, R"({"model":"m","messages":[{"role":1}]})", 400, "messages[0].role",
       "string"},
      {"message_content_type", C, R"({"model":"m","messages":[{"role":"user","content":5}]})", 400,
       "messages[0].content", "string"},
      {"tools_type", C, R"({"model":"m","tools":{},)" + kMsgs + "}", 400, "tools", "array"},
      {"kwargs_type", C, R"({"model":"m","chat_template_kwargs":[],)" + kMsgs + "}", 400,
       "chat_template_kwargs", "object"},
      {"n_big", C, R"({"model":"m","n":17,)" + kMsgs + "}", 400, "n", "[1, 16], got 17"},
      {"n_zero", C, R"({"model":"m","n":0,)" + kMsgs + "}", 400, "n", "[1,"},
      {"n_responses", R, R"({"model":"m","input":"x","n":2})", 400, "n", "/v1/responses"},
      {"best_of_with_n", P, R"({"model":"m","prompt":"x","n":2,"best_of":2})", 400, "best_of",
       "use 'n'"},
      {"max_tokens_zero", C, R"({"model":"m","max_tokens":0,)" + kMsgs + "}", 400, "max_tokens",
       "got 0"},
      {"max_tokens_float", C, R"({"model":"m","max_tokens":1.5,)" + kMsgs + "}", 400, "max_tokens",
       "integer"},
      {"max_completion_tokens_string", C,
       R"({"model":"m","max_completion_tokens":"9",)" + kMsgs + "}", 400, "max_completion_tokens",
       "integer"},
      {"temperature_negative", C, R"({"model":"m","temperature":-0.5,)" + kMsgs + "}", 400,
       "temperature", "[0, 2]"},
      {"number_overflow", C, R"({"model":"m","temperature":1e400,)" + kMsgs + "}", 400, "",
       "number overflow"},
      {"temperature_string", C, R"({"model":"m","temperature":"hot",)" + kMsgs + "}", 400,
       "temperature", "number"},
      {"top_p_zero", C, R"({"model":"m","top_p":0,)" + kMsgs + "}", 400, "top_p", "(0, 1]"},
      {"top_p_above_one", C, R"({"model":"m","top_p":1.5,)" + kMsgs + "}", 400, "top_p", "[0, 1]"},
      {"top_k_negative", C, R"({"model":"m","top_k":-2,)" + kMsgs + "}", 400, "top_k", "-2"},
      {"seed_float", C, R"({"model":"m","seed":0.5,)" + kMsgs + "}", 400, "seed", "integer"},
      {"stop_too_many", C, R"({"model":"m","stop":["a","b","c","d","e"],)" + kMsgs + "}", 400,
       "stop", "at most 4"},
      {"stop_too_long", C, R"({"model":"m","stop":")" + std::string(257, 'x') + "\"," + kMsgs + "}",
       400, "stop", "257 bytes"},
      {"stop_empty", C, R"({"model":"m","stop":[""],)" + kMsgs + "}", 400, "stop", "empty"},
      {"stop_wrong_type", C, R"({"model":"m","stop":7,)" + kMsgs + "}", 400, "stop", "string"},
      {"stop_item_type", C, R"({"model":"m","stop":["a",1],)" + kMsgs + "}", 400, "stop[1]",
       "string"},
      {"stream_type", C, R"({"model":"m","stream":"yes",)" + kMsgs + "}", 400, "stream", "boolean"},
      {"stream_options_type", C, R"({"model":"m","stream":true,"stream_options":1,)" + kMsgs + "}",
       400, "stream_options", "object"},
      {"include_usage_type", C,
       R"({"model":"m","stream":true,"stream_options":{"include_usage":1},)" + kMsgs + "}", 400,
       "stream_options.include_usage", "boolean"},
      {"prompt_missing", P, R"({"model":"m"})", 400, "prompt", "required"},
      {"prompt_empty_string", P, R"({"model":"m","prompt":""})", 400, "prompt", "empty"},
      {"prompt_empty_list", P, R"({"model":"m","prompt":[]})", 400, "prompt", "empty"},
      {"prompt_wrong_type", P, R"({"model":"m","prompt":{}})", 400, "prompt", "string"},
      {"prompt_batch", P, R"({"model":"m","prompt":["a","b"]})", 400, "prompt", "only one"},
      {"prompt_id_too_big", P, R"({"model":"m","prompt":[1,2,50]})", 400, "prompt",
       "token id 50 at prompt[2] is out of range [0, 50)"},
      {"prompt_id_negative", P, R"({"model":"m","prompt":[-1]})", 400, "prompt", "-1"},
      {"prompt_id_mixed", P, R"({"model":"m","prompt":[1,"a"]})", 400, "prompt[1]", "integer"},
      {"prompt_nested_ids_bad", P, R"({"model":"m","prompt":[[3,99]]})", 400, "prompt[0]", "99"},
      // Chat input as OpenAI clients send it (issue #11, item 2).
      {"role_unknown", C, R"({"model":"m","messages":[{"role":"bot","content":"x"}]})", 400,
       "messages[0].role", "role 'bot'; supported roles: system, developer, user, assistant, tool"},
      {"role_function", C, R"({"model":"m","messages":[{"role":"function","content":"x"}]})", 400,
       "messages[0].role", "'function'"},
      {"content_missing", C, R"({"model":"m","messages":[{"role":"user"}]})", 400,
       "messages[0].content", "messages[0] (role 'user') has no content"},
      {"content_null_user", C,
       R"({"model":"m","messages":[{"role":"system","content":null},)"
       R"({"role":"user","content":"x"}]})",
       400, "messages[0].content", "no content"},
      {"assistant_without_content_or_calls", C,
       R"({"model":"m","messages":[{"role":"user","content":"x"},{"role":"assistant"}]})", 400,
       "messages[1].content", "has no content and no tool_calls"},
      {"image_part", C,
       R"({"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},)"
       R"({"type":"image_url","image_url":{"url":"http://x/y.png"}}]}]})",
       400, "messages[0].content[1].type", "type 'image_url'; this model accepts text only"},
      {"audio_part", C,
       R"({"model":"m","messages":[{"role":"user","content":[{"type":"input_audio",)"
       R"("input_audio":{"data":"","format":"wav"}}]}]})",
       400, "messages[0].content[0].type", "'input_audio'; this model accepts text only"},
      {"unknown_part", C,
       R"({"model":"m","messages":[{"role":"user","content":[{"type":"blob"}]}]})", 400,
       "messages[0].content[0].type", "that type is unknown"},
      {"part_not_object", C, R"({"model":"m","messages":[{"role":"user","content":["hi"]}]})", 400,
       "messages[0].content[0]", "an object"},
      {"part_without_type", C,
       R"({"model":"m","messages":[{"role":"user","content":[{"text":"hi"}]}]})", 400,
       "messages[0].content[0].type", "required"},
      {"text_part_without_text", C,
       R"({"model":"m","messages":[{"role":"user","content":[{"type":"text"}]}]})", 400,
       "messages[0].content[0].text", "required"},
      {"text_part_text_type", C,
       R"({"model":"m","messages":[{"role":"user","content":[{"type":"text","text":3}]}]})", 400,
       "messages[0].content[0].text", "string"},
      {"tool_calls_on_user", C,
       R"({"model":"m","messages":[{"role":"user","content":"x","tool_calls":[]}]})", 400,
       "messages[0].tool_calls", "only assistant"},
      {"tool_call_without_function", C,
       R"({"model":"m","messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"a"}]}]})",
       400, "messages[0].tool_calls[0].function", "required"},
      {"tool_call_without_name", C,
       R"({"model":"m","messages":[{"role":"assistant","tool_calls":[{"function":{}}]}]})", 400,
       "messages[0].tool_calls[0].function.name", "required"},
      {"tool_call_arguments_type", C,
       R"({"model":"m","messages":[{"role":"assistant","tool_calls":)"
       R"([{"function":{"name":"f","arguments":3}}]}]})",
       400, "messages[0].tool_calls[0].function.arguments", "a string (JSON) or an object"},
      {"tool_without_name", C,
       R"({"model":"m","tools":[{"type":"function","function":{}}],)" + kMsgs + "}", 400,
       "tools[0].function.name", "required"},
      // Tool names as OpenAI validates them: ^[a-zA-Z0-9_-]{1,64}$.
      {"tool_name_markup", C,
       R"({"model":"m","tools":[{"type":"function","function":{"name":"get_weather"}},)"
       R"({"type":"function","function":{"name":"f</tool_call>"}}],)" +
           kMsgs + "}",
       400, "tools[1].function.name", R"("f</tool_call>" must be 1 to 64 characters)"},
      {"tool_name_empty", C,
       R"({"model":"m","tools":[{"type":"function","function":{"name":""}}],)" + kMsgs + "}", 400,
       "tools[0].function.name", "1 to 64 characters"},
      {"tool_name_space", C,
       R"({"model":"m","tools":[{"type":"function","function":{"name":"get weather"}}],)" + kMsgs +
           "}",
       400, "tools[0].function.name", "\"get weather\""},
      {"tool_name_dot", C,
       R"({"model":"m","tools":[{"type":"function","function":{"name":"a.b"}}],)" + kMsgs + "}",
       400, "tools[0].function.name", "underscore and dash"},
      {"tool_name_65", C,
       R"({"model":"m","tools":[{"type":"function","function":{"name":")" + std::string(65, 'a') +
           R"("}}],)" + kMsgs + "}",
       400, "tools[0].function.name", "1 to 64 characters"},
      {"tool_name_unicode", C,
       R"({"model":"m","tools":[{"type":"function","function":{"name":"wetter_\u00e4"}}],)" +
           kMsgs + "}",
       400, "tools[0].function.name", "1 to 64 characters"},
      {"tool_wrong_type", C, R"({"model":"m","tools":[{"type":"web_search"}],)" + kMsgs + "}", 400,
       "tools[0].type", "web_search"},
      {"reasoning_content_type", C,
       R"({"model":"m","messages":[{"role":"assistant","content":"x","reasoning_content":1}]})",
       400, "messages[0].reasoning_content", "string"},
      // Parameters that stay unsupported are named (item 5).
      // logprobs: OpenAI's ranges and types, top_logprobs only with logprobs.
      {"logprobs_type", C, R"({"model":"m","logprobs":2,)" + kMsgs + "}", 400, "logprobs",
       "'logprobs' must be a boolean"},
      {"top_logprobs_alone", C, R"({"model":"m","top_logprobs":3,)" + kMsgs + "}", 400,
       "top_logprobs", "needs 'logprobs' set to true"},
      {"top_logprobs_range", C, R"({"model":"m","logprobs":true,"top_logprobs":21,)" + kMsgs + "}",
       400, "top_logprobs", "[0, 20], got 21"},
      {"completion_logprobs", P, R"({"model":"m","prompt":"x","logprobs":21})", 400, "logprobs",
       "[0, 20], got 21"},
      {"responses_logprobs", R, R"({"model":"m","input":"x","top_logprobs":2})", 400,
       "top_logprobs", "/v1/chat/completions"},
      // Penalties: OpenAI's [-2, 2], repetition_penalty in [0.01, 100] (engine_api.h).
      {"presence_penalty", C, R"({"model":"m","presence_penalty":2.5,)" + kMsgs + "}", 400,
       "presence_penalty", "[-2, 2], got 2.5"},
      {"frequency_penalty", P, R"({"model":"m","prompt":"x","frequency_penalty":-3})", 400,
       "frequency_penalty", "[-2, 2], got -3"},
      {"frequency_penalty_type", C, R"({"model":"m","frequency_penalty":"1",)" + kMsgs + "}", 400,
       "frequency_penalty", "a number"},
      {"repetition_penalty_zero", C, R"({"model":"m","repetition_penalty":0,)" + kMsgs + "}", 400,
       "repetition_penalty", "[0.01, 100], got 0"},
      {"repetition_penalty_negative", P, R"({"model":"m","prompt":"x","repetition_penalty":-1})",
       400, "repetition_penalty", "[0.01, 100], got -1"},
      {"repetition_penalty_underflow", C,
       R"({"model":"m","repetition_penalty":1e-300,)" + kMsgs + "}", 400, "repetition_penalty",
       "got 1e-300"},
      // Positive, and a float denormal or more: a positive logit divided by it is infinite.
      {"repetition_penalty_tiny", C, R"({"model":"m","repetition_penalty":1e-39,)" + kMsgs + "}",
       400, "repetition_penalty", "[0.01, 100], got 1e-39"},
      {"repetition_penalty_small", P, R"({"model":"m","prompt":"x","repetition_penalty":0.0099})",
       400, "repetition_penalty", "got 0.0099"},
      {"repetition_penalty_huge", P, R"({"model":"m","prompt":"x","repetition_penalty":1e38})", 400,
       "repetition_penalty", "[0.01, 100], got 1e+38"},
      {"repetition_penalty_type", C, R"({"model":"m","repetition_penalty":"2",)" + kMsgs + "}", 400,
       "repetition_penalty", "a number"},
      {"logit_bias", C, R"({"model":"m","logit_bias":{"5":-100},)" + kMsgs + "}", 400, "logit_bias",
       "not supported"},
      {"response_format_schema_missing", C,
       R"({"model":"m","response_format":{"type":"json_schema","json_schema":{"name":"x"}},)" +
           kMsgs + "}",
       400, "response_format.json_schema.schema", "is required"},
      {"response_format_json_schema_missing", P,
       R"({"model":"m","prompt":"x","response_format":{"type":"json_schema"}})", 400,
       "response_format.json_schema", "is required"},
      {"response_format_schema_pattern", C,
       R"({"model":"m","response_format":{"type":"json_schema","json_schema":{"name":"x","schema":)"
       R"({"type":"object","properties":{"a":{"type":"string","pattern":"(?<=x)a"}}}}},)" +
           kMsgs + "}",
       400, "response_format.json_schema.schema",
       "'pattern' (at #/properties/a): lookbehind '(?<=' is not supported (offset 0)"},
      {"response_format_schema_oneof", P,
       R"({"model":"m","prompt":"x","response_format":{"type":"json_schema","json_schema":)"
       R"({"schema":{"oneOf":[{"type":"string"}]}}}})",
       400, "response_format.json_schema.schema", "'oneOf' (at #) is not supported"},
      {"response_format_schema_strict_type", C,
       R"({"model":"m","response_format":{"type":"json_schema","json_schema":{"schema":{},)"
       R"("strict":"yes"}},)" +
           kMsgs + "}",
       400, "response_format.json_schema.strict", "a boolean"},
      {"response_format_schema_not_object", C,
       R"({"model":"m","response_format":{"type":"json_schema","json_schema":{"schema":4}},)" +
           kMsgs + "}",
       400, "response_format.json_schema.schema", "must be an object or a boolean"},
      {"response_format_grammar", C,
       R"({"model":"m","response_format":{"type":"grammar","grammar":"x"},)" + kMsgs + "}", 400,
       "response_format", "structured output is"},
      {"response_format_responses", R,
       R"({"model":"m","input":"x","response_format":{"type":"json_object"}})", 400,
       "response_format", "use 'text.format'"},
      {"text_format_responses_schema", R,
       R"({"model":"m","input":"x","text":{"format":{"type":"json_schema","name":"x",)"
       R"("schema":{"type":"object","properties":{"a":{"format":"email","pattern":"\\1"}}}}}})",
       400, "text.format.schema", "'pattern' (at #/properties/a): the backreference"},
      {"text_format_responses_other", R,
       R"({"model":"m","input":"x","text":{"format":{"type":"grammar"}}})", 400, "text",
       "text.format is"},
      {"tool_strict_unsupported", C,
       R"({"model":"m","tools":[{"type":"function","function":{"name":"f","strict":true,)"
       R"("parameters":{"type":"object","properties":{"n":{"type":"number","multipleOf":2}}}}}],)" +
           kMsgs + "}",
       400, "tools[0].function.parameters", "'multipleOf' (at #/properties/n) is not supported"},
      {"tool_strict_not_object", C,
       R"({"model":"m","tools":[{"type":"function","function":{"name":"f","strict":true,)"
       R"("parameters":{"type":"string"}}}],)" +
           kMsgs + "}",
       400, "tools[0].function.parameters", "must be an object schema"},
      {"tool_strict_type", C,
       R"({"model":"m","tools":[{"type":"function","function":{"name":"f","strict":1}}],)" + kMsgs +
           "}",
       400, "tools[0].function.strict", "a boolean"},
      {"response_format_schema_and_forced_call", C,
       R"({"model":"m","response_format":{"type":"json_schema","json_schema":{"schema":{}}},)"
       R"("tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"required",)" +
           kMsgs + "}",
       400, "response_format", "json_schema cannot be combined"},
      {"response_format_and_forced_call", C,
       R"({"model":"m","response_format":{"type":"json_object"},"tools":[{"type":"function",)"
       R"("function":{"name":"f"}}],"tool_choice":"required",)" +
           kMsgs + "}",
       400, "response_format", "cannot be combined"},
      // tool_choice: required needs tools, a named function must be one of them.
      {"tool_choice_required", C, R"({"model":"m","tool_choice":"required",)" + kMsgs + "}", 400,
       "tool_choice", "needs a non-empty 'tools'"},
      {"tool_choice_named", C,
       R"({"model":"m","tool_choice":{"type":"function","function":{"name":"f"}},)" + kMsgs + "}",
       400, "tool_choice.function.name", "'f', which is not in 'tools'"},
      {"tool_choice_named_unknown", C,
       R"({"model":"m","tools":[{"type":"function","function":{"name":"g"}}],
           "tool_choice":{"type":"function","function":{"name":"f"}},)" +
           kMsgs + "}",
       400, "tool_choice.function.name", "not in 'tools'"},
      {"tool_choice_word", C, R"({"model":"m","tool_choice":"always",)" + kMsgs + "}", 400,
       "tool_choice", "\"always\" is not one of"},
      {"tool_choice_type", C, R"({"model":"m","tool_choice":{"type":"web"},)" + kMsgs + "}", 400,
       "tool_choice.type", "\"function\""},
      {"tool_choice_no_name", C,
       R"({"model":"m","tool_choice":{"type":"function","function":{}},)" + kMsgs + "}", 400,
       "tool_choice.function.name", "required"},
      {"tool_choice_number", C, R"({"model":"m","tool_choice":3,)" + kMsgs + "}", 400,
       "tool_choice", "a string or an object"},
      {"tool_choice_completions", P, R"({"model":"m","prompt":"x","tool_choice":"required"})", 400,
       "tool_choice", "/v1/chat/completions"},
      {"functions", C, R"({"model":"m","functions":[{"name":"f"}],)" + kMsgs + "}", 400,
       "functions", "use 'tools'"},
      {"best_of", P, R"({"model":"m","prompt":"x","best_of":3})", 400, "best_of", "3"},
      {"echo", P, R"({"model":"m","prompt":"x","echo":true})", 400, "echo", "not supported"},
      {"suffix", P, R"({"model":"m","prompt":"x","suffix":"end"})", 400, "suffix", "\"end\""},
      {"min_p", C, R"({"model":"m","min_p":0.1,)" + kMsgs + "}", 400, "min_p", "0.1"},
      {"stop_token_ids", C, R"({"model":"m","stop_token_ids":[7],)" + kMsgs + "}", 400,
       "stop_token_ids", "use 'stop'"},
      // Item 7: a top_p that is 0 for the sampler is refused with the value sent.
      {"top_p_underflow", C, R"({"model":"m","top_p":1e-50,)" + kMsgs + "}", 400, "top_p",
       "got 1e-50, which rounds to 0 in the sampler's 32-bit floats"},
      {"top_p_underflow_300", P, R"({"model":"m","prompt":"x","top_p":1e-300})", 400, "top_p",
       "got 1e-300, which rounds to 0"},
      {"top_p_zero", C, R"({"model":"m","top_p":0,)" + kMsgs + "}", 400, "top_p", "(0, 1], got 0"},
  };
}

TEST(OpenAIRequest, RejectsBadInputWithFieldAndStatus) {
  for (const BadCase& c : bad_cases()) {
    SCOPED_TRACE(c.name);
    ParseResult r = parse_openai_request(c.endpoint, c.body, kLimits);
    const ApiError* e = std::get_if<ApiError>(&r);
    ASSERT_NE(e, nullptr) << "accepted: " << c.body.substr(0, 200);
    EXPECT_EQ(e->http_status, c.status) << e->message;
    EXPECT_EQ(e->param, c.param) << e->message;
    EXPECT_NE(e->message.find(c.message_part), std::string::npos)
        << "message: " << e->message << "\nwanted: " << c.message_part;
    EXPECT_EQ(e->type, "invalid_request_error");
  }
}

TEST(OpenAIRequest, ToolNamesOpenAIAccepts) {
  const std::string names[] = {"f", "get_weather", "Get-Weather_2", std::string(64, 'z')};
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    ParseResult r = chat(R"({"model":"m","tools":[{"type":"function","function":{"name":")" + name +
                         R"("}}],"tool_choice":"required",)" + kMsgs + "}");
    ASSERT_TRUE(std::holds_alternative<OpenAIRequest>(r)) << std::get<ApiError>(r).message;
    EXPECT_EQ(std::get<OpenAIRequest>(r).tool_call_names, std::vector<std::string>{name});
  }
}

TEST(OpenAIRequest, JsonObjectResponseFormat) {
  ParseResult c = chat(R"({"model":"m","response_format":{"type":"json_object"},)" + kMsgs + "}");
  ASSERT_TRUE(std::holds_alternative<OpenAIRequest>(c)) << std::get<ApiError>(c).message;
  EXPECT_TRUE(std::get<OpenAIRequest>(c).json_object);
  ParseResult p = completion(R"({"model":"m","prompt":"x","response_format":{"type":"json_object"}})");
  ASSERT_TRUE(std::holds_alternative<OpenAIRequest>(p)) << std::get<ApiError>(p).message;
  EXPECT_TRUE(std::get<OpenAIRequest>(p).json_object);
  ParseResult t = chat(R"({"model":"m","response_format":{"type":"text"},)" + kMsgs + "}");
  ASSERT_TRUE(std::holds_alternative<OpenAIRequest>(t));
  EXPECT_FALSE(std::get<OpenAIRequest>(t).json_object);
}

TEST(OpenAIRequest, JsonSchemaResponseFormat) {
  const std::string schema =
      R"({"type":"object","properties":{"a":{"type":"integer"}},"required":["a"],)"
      R"("additionalProperties":false})";
  for (const char* strict : {"true", "false"}) {
    ParseResult c = chat(R"({"model":"m","response_format":{"type":"json_schema","json_schema":)"
                         R"({"name":"x","strict":)" +
                         std::string(strict) + R"(,"schema":)" + schema + "}}," + kMsgs + "}");
    ASSERT_TRUE(std::holds_alternative<OpenAIRequest>(c)) << std::get<ApiError>(c).message;
    ASSERT_TRUE(std::get<OpenAIRequest>(c).json_schema);
    EXPECT_TRUE(std::get<OpenAIRequest>(c).json_schema->root_is_object());
    EXPECT_FALSE(std::get<OpenAIRequest>(c).json_object);
  }
  ParseResult p = completion(R"({"model":"m","prompt":"x","response_format":{"type":"json_schema",)"
                             R"("json_schema":{"schema":)" +
                             schema + "}}}");
  ASSERT_TRUE(std::holds_alternative<OpenAIRequest>(p)) << std::get<ApiError>(p).message;
  EXPECT_TRUE(std::get<OpenAIRequest>(p).json_schema);
  // /v1/responses: text.format, flat; echoed in the response.
  ParseResult r = parse_openai_request(
      Endpoint::kResponses,
      R"({"model":"m","input":"x","text":{"format":{"type":"json_schema","name":"x","strict":true,)"
      R"("schema":)" +
          schema + "}}}",
      kLimits);
  ASSERT_TRUE(std::holds_alternative<OpenAIRequest>(r)) << std::get<ApiError>(r).message;
  EXPECT_TRUE(std::get<OpenAIRequest>(r).json_schema);
  EXPECT_EQ(std::get<OpenAIRequest>(r).text_format["name"], "x");
  ParseResult o = parse_openai_request(
      Endpoint::kResponses, R"({"model":"m","input":"x","text":{"format":{"type":"json_object"}}})",
      kLimits);
  ASSERT_TRUE(std::holds_alternative<OpenAIRequest>(o)) << std::get<ApiError>(o).message;
  EXPECT_TRUE(std::get<OpenAIRequest>(o).json_object);
}

// Strict tools: a forced call carries each named tool's compiled parameters (null when not strict).
TEST(OpenAIRequest, StrictToolSchemas) {
  const std::string tools =
      R"("tools":[{"type":"function","function":{"name":"a","strict":true,"parameters":)"
      R"({"type":"object","properties":{"x":{"type":"string","format":"date"}},"required":["x"],)"
      R"("additionalProperties":false}}},{"type":"function","function":{"name":"b",)"
      R"("parameters":{"type":"object","properties":{"y":{"type":"string","pattern":"\\1"}}}}}],)";
  ParseResult req = chat(R"({"model":"m",)" + tools + R"("tool_choice":"required",)" + kMsgs + "}");
  ASSERT_TRUE(std::holds_alternative<OpenAIRequest>(req)) << std::get<ApiError>(req).message;
  const OpenAIRequest& r = std::get<OpenAIRequest>(req);
  ASSERT_EQ(r.tool_call_names, (std::vector<std::string>{"a", "b"}));
  ASSERT_EQ(r.tool_call_schemas.size(), 2u);
  EXPECT_TRUE(r.tool_call_schemas[0]);
  EXPECT_FALSE(r.tool_call_schemas[1]);  // not strict: any object (its pattern is not compiled)
  ParseResult named =
      chat(R"({"model":"m",)" + tools +
           R"("tool_choice":{"type":"function","function":{"name":"a"}},)" + kMsgs + "}");
  ASSERT_TRUE(std::holds_alternative<OpenAIRequest>(named));
  EXPECT_EQ(std::get<OpenAIRequest>(named).tool_call_schemas.size(), 1u);
  EXPECT_FALSE(std::get<OpenAIRequest>(named).tool_call_on_start);
  // tool_choice auto (given or not): a call the model starts follows its tool's schema.
  for (const std::string choice : {"", R"("tool_choice":"auto",)"}) {
    ParseResult automatic = chat(R"({"model":"m",)" + tools + choice + kMsgs + "}");
    ASSERT_TRUE(std::holds_alternative<OpenAIRequest>(automatic));
    const OpenAIRequest& a = std::get<OpenAIRequest>(automatic);
    EXPECT_TRUE(a.tool_call_on_start) << choice;
    EXPECT_EQ(a.tool_call_names, (std::vector<std::string>{"a", "b"}));
    ASSERT_EQ(a.tool_call_schemas.size(), 2u);
    EXPECT_TRUE(a.tool_call_schemas[0]);
  }
  // Not with tool_choice none, nor beside a response_format (which constrains the whole output).
  for (const std::string other :
       {R"("tool_choice":"none",)", R"("response_format":{"type":"json_object"},)"}) {
    ParseResult r2 = chat(R"({"model":"m",)" + tools + other + kMsgs + "}");
    ASSERT_TRUE(std::holds_alternative<OpenAIRequest>(r2)) << other;
    EXPECT_FALSE(std::get<OpenAIRequest>(r2).tool_call_on_start) << other;
    EXPECT_TRUE(std::get<OpenAIRequest>(r2).tool_call_names.empty()) << other;
  }
}

TEST(OpenAIRequest, RepetitionPenaltyBounds) {
  for (double r : {0.01, 1.0, 1.3, 100.0}) {
    SCOPED_TRACE(r);
    ParseResult p =
        completion(R"({"model":"m","prompt":"x","repetition_penalty":)" + std::to_string(r) + "}");
    ASSERT_TRUE(std::holds_alternative<OpenAIRequest>(p)) << std::get<ApiError>(p).message;
    EXPECT_FLOAT_EQ(std::get<OpenAIRequest>(p).sampling.repetition_penalty, static_cast<float>(r));
  }
}

// n beyond the requests the engine can hold at once (running + queued) is a 400 naming n, not a
// 429 that no retry can cure; up to it is accepted.
TEST(OpenAIRequest, ChoicesBeyondTheEngineAre400) {
  const ModelLimits limits{"m", 100, 50, /*max_live_requests=*/6};
  ParseResult ok =
      parse_openai_request(Endpoint::kCompletions, R"({"model":"m","prompt":"x","n":6})", limits);
  ASSERT_TRUE(std::holds_alternative<OpenAIRequest>(ok)) << std::get<ApiError>(ok).message;
  EXPECT_EQ(std::get<OpenAIRequest>(ok).n, 6);
  ParseResult bad = parse_openai_request(Endpoint::kChatCompletions,
                                         R"({"model":"m","n":7,)" + kMsgs + "}", limits);
  ASSERT_TRUE(std::holds_alternative<ApiError>(bad));
  const ApiError& e = std::get<ApiError>(bad);
  EXPECT_EQ(e.http_status, 400);
  EXPECT_EQ(e.param, "n");
  EXPECT_NE(e.message.find("'n' = 7 exceeds the 6 requests"), std::string::npos) << e.message;
}

TEST(OpenAIRequest, UnknownModelIsModelNotFound) {
  ParseResult r = chat(R"({"model":"other",)" + kMsgs + "}");
  ASSERT_TRUE(std::holds_alternative<ApiError>(r));
  EXPECT_EQ(std::get<ApiError>(r).code, "model_not_found");
}

TEST(OpenAIRequest, OversizedBodyIs413) {
  std::string body(kMaxBodyBytes + 1, ' ');
  ParseResult r = chat(body);
  ASSERT_TRUE(std::holds_alternative<ApiError>(r));
  EXPECT_EQ(std::get<ApiError>(r).http_status, 413);
}

TEST(OpenAIRequest, DepthLimitIsExactAndIgnoresStrings) {
  // 64 levels in total (the outer object is one) pass, 65 fail.
  auto nest = [](int n) {
    return R"({"model":"m",)" + kMsgs + R"(,"x":)" + std::string(n - 1, '[') +
           std::string(n - 1, ']') + "}";
  };
  EXPECT_TRUE(std::holds_alternative<OpenAIRequest>(chat(nest(64))));
  EXPECT_TRUE(std::holds_alternative<ApiError>(chat(nest(65))));
  EXPECT_FALSE(json_depth_exceeds(R"({"s":")" + std::string(1000, '[') + R"("})", 64));
  EXPECT_FALSE(json_depth_exceeds(R"({"s":"\"[[[[\\"})", 2));
  EXPECT_TRUE(json_depth_exceeds("[[[", 2));
}

TEST(OpenAIRequest, AcceptsFullChatRequest) {
  ParseResult r = chat(R"({"model":"m","messages":[{"role":"system","content":"s"},
      {"role":"user","content":[{"type":"text","text":"hi"}]},{"role":"assistant","content":null,
      "tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]}],
      "max_tokens":5,"max_completion_tokens":7,"temperature":0,"top_p":0.9,"top_k":40,"seed":-3,
      "stop":"END","stream":true,"stream_options":{"include_usage":true},"n":1,"ignore_eos":true,
      "tools":[{"type":"function","function":{"name":"f"}}],
      "chat_template_kwargs":{"enable_thinking":false},
      "frequency_penalty":0,"presence_penalty":0.0,"logprobs":false,"tool_choice":"auto",
      "response_format":{"type":"text"},"user":"ignored","logit_bias":null})");
  ASSERT_TRUE(std::holds_alternative<OpenAIRequest>(r)) << std::get<ApiError>(r).message;
  const OpenAIRequest& q = std::get<OpenAIRequest>(r);
  EXPECT_EQ(q.messages.size(), 3u);
  EXPECT_EQ(q.max_tokens, 7);  // max_completion_tokens wins
  EXPECT_EQ(q.sampling.config.temperature, 0.0f);
  EXPECT_FLOAT_EQ(q.sampling.config.top_p, 0.9f);
  EXPECT_EQ(q.sampling.config.top_k, 40);
  EXPECT_TRUE(q.sampling.has_seed);
  EXPECT_EQ(q.sampling.config.seed, static_cast<uint64_t>(-3));
  EXPECT_EQ(q.stop, std::vector<std::string>{"END"});
  EXPECT_TRUE(q.stream);
  EXPECT_TRUE(q.include_usage);
  EXPECT_TRUE(q.ignore_eos);
  EXPECT_TRUE(q.tools.is_array());
  EXPECT_FALSE(q.chat_template_kwargs.at("enable_thinking").get<bool>());
}

TEST(OpenAIRequest, NormalizesChatInput) {
  ParseResult r = chat(R"({"model":"m","messages":[
      {"role":"developer","content":"be brief"},
      {"role":"user","content":[{"type":"text","text":"line 1"},{"type":"text","text":"line 2"}]},
      {"role":"assistant","content":[{"type":"text","text":"ok"}],"tool_calls":[]},
      {"role":"user","content":""}],"tools":[]})");
  ASSERT_TRUE(std::holds_alternative<OpenAIRequest>(r)) << std::get<ApiError>(r).message;
  const OpenAIRequest& q = std::get<OpenAIRequest>(r);
  ASSERT_EQ(q.messages.size(), 4u);
  EXPECT_EQ(q.messages[0]["role"], "system");
  EXPECT_EQ(q.messages[0]["content"], "be brief");
  EXPECT_EQ(q.messages[1]["content"], "line 1\nline 2");
  EXPECT_EQ(q.messages[2]["content"], "ok");
  EXPECT_FALSE(q.messages[2].contains("tool_calls"));  // an empty list is no calls
  EXPECT_EQ(q.messages[3]["content"], "");
  EXPECT_TRUE(q.tools.is_null());  // no tools: the template renders none
}

TEST(OpenAIRequest, ResponsesInput) {
  auto r = parse_openai_request(Endpoint::kResponses,
                                R"({"model":"m","instructions":"i","input":"hello",
                                    "max_output_tokens":9,"temperature":0.5})",
                                kLimits);
  ASSERT_TRUE(std::holds_alternative<OpenAIRequest>(r)) << std::get<ApiError>(r).message;
  const OpenAIRequest& q = std::get<OpenAIRequest>(r);
  ASSERT_EQ(q.messages.size(), 2u);
  EXPECT_EQ(q.messages[0]["role"], "system");
  EXPECT_EQ(q.messages[0]["content"], "i");
  EXPECT_EQ(q.messages[1]["role"], "user");
  EXPECT_EQ(q.messages[1]["content"], "hello");
  EXPECT_EQ(q.max_tokens, 9);
  auto bad = parse_openai_request(Endpoint::kResponses,
                                  R"({"model":"m","instructions":"i","input":[{"role":"user",
                                      "content":[{"type":"input_image","image_url":"x"}]}]})",
                                  kLimits);
  ASSERT_TRUE(std::holds_alternative<ApiError>(bad));
  EXPECT_EQ(std::get<ApiError>(bad).param, "input[0].content[0].type");
  EXPECT_NE(std::get<ApiError>(bad).message.find("input[0].content[0] is a content part"),
            std::string::npos)
      << std::get<ApiError>(bad).message;
  auto tools = parse_openai_request(
      Endpoint::kResponses, R"({"model":"m","input":"x","tools":[{"type":"web_search"}]})",
      kLimits);
  ASSERT_TRUE(std::holds_alternative<ApiError>(tools));
  EXPECT_EQ(std::get<ApiError>(tools).param, "tools");
}

TEST(OpenAIRequest, DefaultsAndNulls) {
  ParseResult r = chat(R"({"model":"m","temperature":null,"stop":null,"n":null,)" + kMsgs + "}");
  ASSERT_TRUE(std::holds_alternative<OpenAIRequest>(r)) << std::get<ApiError>(r).message;
  const OpenAIRequest& q = std::get<OpenAIRequest>(r);
  EXPECT_FALSE(q.max_tokens.has_value());
  EXPECT_EQ(q.sampling.config.temperature, 1.0f);
  EXPECT_EQ(q.sampling.config.top_k, 0);
  EXPECT_FALSE(q.sampling.has_seed);
  EXPECT_FALSE(q.stream);
  EXPECT_TRUE(q.stop.empty());
  EXPECT_TRUE(q.tools.is_null());
}

TEST(OpenAIRequest, PromptForms) {
  auto text = completion(R"({"model":"m","prompt":"abc"})");
  ASSERT_TRUE(std::holds_alternative<OpenAIRequest>(text));
  EXPECT_EQ(std::get<OpenAIRequest>(text).prompt_text, "abc");
  EXPECT_FALSE(std::get<OpenAIRequest>(text).prompt_is_ids);

  auto one = completion(R"({"model":"m","prompt":["xyz"]})");
  ASSERT_TRUE(std::holds_alternative<OpenAIRequest>(one));
  EXPECT_EQ(std::get<OpenAIRequest>(one).prompt_text, "xyz");

  auto ids = completion(R"({"model":"m","prompt":[0,1,49]})");
  ASSERT_TRUE(std::holds_alternative<OpenAIRequest>(ids));
  EXPECT_EQ(std::get<OpenAIRequest>(ids).prompt_ids, (std::vector<int32_t>{0, 1, 49}));

  auto nested = completion(R"({"model":"m","prompt":[[7,8]]})");
  ASSERT_TRUE(std::holds_alternative<OpenAIRequest>(nested));
  EXPECT_EQ(std::get<OpenAIRequest>(nested).prompt_ids, (std::vector<int32_t>{7, 8}));
}

TEST(OpenAIRequest, ContextFit) {
  auto ok = check_context_fit(10, std::nullopt, 100);
  ASSERT_TRUE(std::holds_alternative<int>(ok));
  EXPECT_EQ(std::get<int>(ok), 90);
  EXPECT_EQ(std::get<int>(check_context_fit(10, 90, 100)), 90);

  auto over = check_context_fit(10, 91, 100);
  ASSERT_TRUE(std::holds_alternative<ApiError>(over));
  const ApiError& e = std::get<ApiError>(over);
  EXPECT_EQ(e.http_status, 400);
  EXPECT_EQ(e.code, "context_length_exceeded");
  EXPECT_NE(e.message.find("maximum context length is 100 tokens"), std::string::npos);
  EXPECT_NE(e.message.find("101 tokens (10 in the prompt, 91 in the completion)"),
            std::string::npos)
      << e.message;

  EXPECT_TRUE(std::holds_alternative<ApiError>(check_context_fit(100, std::nullopt, 100)));
  EXPECT_TRUE(std::holds_alternative<ApiError>(check_context_fit(0, 5, 100)));
}

TEST(OpenAIRequest, ErrorJsonShape) {
  ApiError e = invalid_request("bad \"x\"", "x");
  auto j = nlohmann::json::parse(e.to_json());
  EXPECT_EQ(j["error"]["message"], "bad \"x\"");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "x");
  EXPECT_TRUE(j["error"]["code"].is_null());
}

TEST(OpenAIResponse, ChatBodyAndChunks) {
  ResponseMeta meta{Endpoint::kChatCompletions, "chatcmpl-1", 42, "m"};
  auto body = completion_body(meta, "hi", "length", Usage{3, 2, 1});
  EXPECT_EQ(dump_json(body),
            R"({"id":"chatcmpl-1","object":"chat.completion","created":42,"model":"m",)"
            R"("choices":[{"index":0,"message":{"role":"assistant","content":"hi"},)"
            R"("logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":3,)"
            R"("completion_tokens":2,"total_tokens":5,"prompt_tokens_details":{"cached_tokens":1}}})");
  EXPECT_EQ(sse_event(stream_chunk(meta, "", true, "")),
            R"(data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":42,)"
            R"("model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},)"
            R"("logprobs":null,"finish_reason":null}]})"
            "\n\n");
  auto u = usage_chunk(meta, Usage{3, 2, 0});
  EXPECT_TRUE(u["choices"].empty());
  EXPECT_EQ(u["usage"]["total_tokens"], 5);
  EXPECT_EQ(make_response_id(Endpoint::kChatCompletions).rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(make_response_id(Endpoint::kCompletions).rfind("cmpl-", 0), 0u);
  EXPECT_EQ(openai_finish_reason("cancelled"), "abort");
}

}  // namespace
}  // namespace oscar::server
