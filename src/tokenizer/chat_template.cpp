// ChatTemplate: parse once, validate filter/test names, render per request (see chat_template.h).
#include "tokenizer/chat_template.h"

#include "jinja/eval.h"
#include "jinja/parser.h"

namespace oscar::tok {

struct ChatTemplate::Impl {
  ChatTemplateOptions options;
  jinja::Body body;
};

namespace {

using jinja::Expr;
using jinja::Node;

Status validate_expr(const Expr* e) {
  if (!e) return Status();
  if (e->kind == Expr::Kind::kFilter && !jinja::has_filter(e->name)) {
    return invalid_argument("chat template: line %d: no filter named '%s'", e->line,
                            e->name.c_str());
  }
  if (e->kind == Expr::Kind::kTest && !jinja::has_test(e->name)) {
    return invalid_argument("chat template: line %d: no test named '%s'", e->line,
                            e->name.c_str());
  }
  for (const auto& a : e->args) OSCAR_RETURN_IF_ERROR(validate_expr(a.get()));
  return Status();
}

Status validate_body(const jinja::Body& body) {
  for (const auto& n : body) {
    OSCAR_RETURN_IF_ERROR(validate_expr(n->expr.get()));
    OSCAR_RETURN_IF_ERROR(validate_expr(n->cond.get()));
    for (const auto& c : n->conds) OSCAR_RETURN_IF_ERROR(validate_expr(c.get()));
    for (const auto& d : n->defaults) OSCAR_RETURN_IF_ERROR(validate_expr(d.get()));
    for (const auto& b : n->bodies) OSCAR_RETURN_IF_ERROR(validate_body(b));
    OSCAR_RETURN_IF_ERROR(validate_body(n->else_body));
  }
  return Status();
}

}  // namespace

Result<ChatTemplate> ChatTemplate::parse(std::string_view source,
                                         const ChatTemplateOptions& options) {
  if (static_cast<int64_t>(source.size()) > options.max_template_bytes) {
    return out_of_range("chat template: %zu bytes exceeds the limit of %lld", source.size(),
                        (long long)options.max_template_bytes);
  }
  jinja::LexerOptions lex;
  lex.trim_blocks = options.trim_blocks;
  lex.lstrip_blocks = options.lstrip_blocks;
  lex.keep_trailing_newline = options.keep_trailing_newline;
  jinja::ParseLimits limits;
  limits.max_expr_depth = options.max_expr_depth;
  limits.max_block_depth = options.max_block_depth;
  auto impl = std::make_shared<Impl>();
  impl->options = options;
  OSCAR_ASSIGN_OR_RETURN(impl->body, jinja::parse_template(source, lex, limits));
  OSCAR_RETURN_IF_ERROR(validate_body(impl->body));
  return ChatTemplate(std::move(impl));
}

const ChatTemplateOptions& ChatTemplate::options() const { return impl_->options; }

Result<std::string> ChatTemplate::render(const nlohmann::ordered_json& context) const {
  if (!context.is_object() && !context.is_null()) {
    return invalid_argument("chat template: the context must be a JSON object, got %s",
                            context.type_name());
  }
  const ChatTemplateOptions& o = impl_->options;
  OSCAR_ASSIGN_OR_RETURN(jinja::Value ctx,
                         jinja::from_json(context.is_null() ? nlohmann::ordered_json::object()
                                                            : context,
                                          256));
  jinja::EvalLimits limits;
  limits.max_loop_iterations = o.max_loop_iterations;
  limits.max_work_units = o.max_work_units;
  limits.max_output_bytes = o.max_output_bytes;
  limits.max_depth = o.max_eval_depth;
  limits.max_macro_depth = o.max_macro_depth;
  jinja::Evaluator ev(limits);
  return ev.render(impl_->body, ctx);
}

Result<std::string> render_chat(const ChatTemplate& tmpl, const nlohmann::ordered_json& messages,
                                const nlohmann::ordered_json& tools, bool add_generation_prompt,
                                const nlohmann::ordered_json& extra_kwargs,
                                const std::string& bos_token, const std::string& eos_token) {
  if (!extra_kwargs.is_null() && !extra_kwargs.is_object()) {
    return invalid_argument("chat template: extra kwargs must be a JSON object, got %s",
                            extra_kwargs.type_name());
  }
  nlohmann::ordered_json ctx = nlohmann::ordered_json::object();
  ctx["messages"] = messages;
  ctx["tools"] = tools;
  ctx["documents"] = nullptr;
  ctx["add_generation_prompt"] = add_generation_prompt;
  ctx["bos_token"] = bos_token;
  ctx["eos_token"] = eos_token;
  if (extra_kwargs.is_object()) {
    for (auto it = extra_kwargs.begin(); it != extra_kwargs.end(); ++it) ctx[it.key()] = it.value();
  }
  return tmpl.render(ctx);
}

}  // namespace oscar::tok
