// Parser of the Jinja2 subset: tokens (jinja/lexer.h) to a syntax tree (jinja/ast.h), with
// Jinja's operator precedence. Errors name the line and what was expected. Tags that need files
// or modules (include, import, extends, block) are refused: templates are sandboxed.
#pragma once

#include <string_view>

#include "core/status.h"
#include "jinja/ast.h"
#include "jinja/lexer.h"

namespace oscar::jinja {

struct ParseLimits {
  int max_expr_depth = 200;  // height of one expression tree
  int max_block_depth = 64;  // nesting of {% if %}, {% for %}, ...
};

Result<Body> parse_template(std::string_view source, const LexerOptions& lexer_options,
                            const ParseLimits& limits);

}  // namespace oscar::jinja
