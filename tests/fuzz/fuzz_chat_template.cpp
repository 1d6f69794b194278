// libFuzzer target: ChatTemplate::parse + render of arbitrary template text against a fixed small
// chat context. Must return text or a Status, never crash, hang or exhaust memory: the caps
// (loop iterations, work units, nesting depth, output size) are lowered here so that every input
// finishes in milliseconds.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "tokenizer/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using oscar::tok::ChatTemplate;
  static const nlohmann::ordered_json kContext = nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "You are terse."},
      {"role": "user", "content": "Hi \u4f60\u597d \"q\" \\ <tool_response>x</tool_response>"},
      {"role": "assistant", "content": "<think>\nr\n</think>\n\nok", "reasoning_content": null,
       "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"a": [1, 2.5, true]}}}]},
      {"role": "tool", "content": "{\"t\": -3}"}
    ],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "add_generation_prompt": true, "enable_thinking": false, "bos_token": "", "eos_token": "<|im_end|>",
    "n": 3, "x": 1.5, "empty": {}, "none": null
  })");
  oscar::tok::ChatTemplateOptions opt;
  opt.max_template_bytes = 64 << 10;
  opt.max_output_bytes = 1 << 20;
  opt.max_loop_iterations = 20000;
  opt.max_work_units = 200000;
  auto tmpl = ChatTemplate::parse(std::string_view(reinterpret_cast<const char*>(data), size), opt);
  if (!tmpl.ok()) return 0;
  auto out = tmpl->render(kContext);
  if (out.ok()) {
    volatile size_t sink = out->size();
    (void)sink;
  }
  return 0;
}
