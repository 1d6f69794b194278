// Chat templates: renders a Hugging Face chat template (the Jinja2 `chat_template` string of
// tokenizer_config.json) the way transformers' apply_chat_template does, with a small sandboxed
// Jinja2-subset interpreter (jinja_*.h). Defaults match transformers' environment:
// trim_blocks and lstrip_blocks on, the loopcontrols extension, `tojson` as json.dumps with
// ", "/": " separators, non-ASCII kept and key order preserved, raise_exception() and
// strftime_now() globals. Rendering is bounded (loop iterations, work, nesting, output size), so
// a hostile template yields an error Status, never a hang or a crash. No file access, imports,
// includes or mutating methods. Not here: tokenization of the rendered text (tokenizer.h).
//
// Supported: {{ }} {% %} {# #} with `-`/`+` whitespace control, raw, if/elif/else, for (loop
// variables, loop filter, else, break/continue), set (tuples, namespace attributes, blocks),
// macro (defaults, varargs, kwargs), filter blocks, with, generation; Python operators, literals,
// slicing, str/dict methods, printf-style % and str.format ({} {0} {name}); the common filters
// and tests (jinja/builtins.cpp). Not supported (an error, never a wrong rendering): groupby and
// a few rare filters, recursive loops, {% call %}, non-string dict keys, integers beyond int64,
// format specs in str.format. Tested against Python's Jinja2 on hand-written and random
// templates (tests/chat_template/).
//
// A ChatTemplate is immutable after parse() and safe to render from several threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace oscar::tok {


struct ChatTemplateOptions {
  // Jinja environment flags; transformers uses trim_blocks=True, lstrip_blocks=True.
  bool trim_blocks = true;
  bool lstrip_blocks = true;
  bool keep_trailing_newline = false;
  // Caps.
  int64_t max_template_bytes = 1 << 20;
  int64_t max_output_bytes = 16 << 20;       // rendered text, and any one string or list built
  int64_t max_loop_iterations = 1'000'000;   // summed over all loops of one render
  int64_t max_work_units = 50'000'000;       // ~1 per expression node evaluated
  int max_expr_depth = 200;                  // height of one expression
  int max_block_depth = 64;                  // nesting of {% if/for/... %}
  int max_eval_depth = 400;                  // nested evaluation, macro calls included
  int max_macro_depth = 32;
};

class ChatTemplate {
 public:
  // Parses `source`; errors name the line ("chat template: line 3: unclosed '{% if %}' ...").
  // Unknown filters and tests are reported here rather than at render time.
  static Result<ChatTemplate> parse(std::string_view source,
                                    const ChatTemplateOptions& options = {});

  // Renders with the members of `context` (a JSON object) as template variables. Errors:
  // InvalidArgument for template errors (undefined attribute access, type errors,
  // raise_exception: "chat template raised an exception: <msg>"), ResourceExhausted / OutOfRange
  // for exceeded caps.
  Result<std::string> render(const nlohmann::ordered_json& context) const;

  const ChatTemplateOptions& options() const;

 private:
  struct Impl;
  explicit ChatTemplate(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

// apply_chat_template's variables: messages, tools (none when null), documents (none),
// add_generation_prompt, bos_token, eos_token, then every member of `extra_kwargs` (a JSON
// object or null, e.g. {"enable_thinking": false}), which may override the others.
Result<std::string> render_chat(const ChatTemplate& tmpl, const nlohmann::ordered_json& messages,
                                const nlohmann::ordered_json& tools, bool add_generation_prompt,
                                const nlohmann::ordered_json& extra_kwargs,
                                const std::string& bos_token, const std::string& eos_token);

}  // namespace oscar::tok
