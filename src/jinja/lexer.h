// Lexer of the Jinja2 subset: splits a template into text and the tokens inside {{ }} and {% %}
// tags, applying Jinja's whitespace rules (`-` and `+` markers, trim_blocks, lstrip_blocks,
// newline normalisation and keep_trailing_newline) exactly as jinja2.lexer does. Comments
// {# #} are dropped here; {% raw %} bodies come out as text. No parsing happens here.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace oscar::jinja {

enum class TokKind {
  kText,        // literal template text (after whitespace control)
  kVarBegin,    // {{
  kVarEnd,      // }}
  kBlockBegin,  // {%
  kBlockEnd,    // %}
  kName,        // identifier or keyword
  kString,      // string literal, escapes already decoded
  kInt,
  kFloat,
  kOp,          // operator or punctuation: + - * / // % ** ~ == != < <= > >= = . : | , ( ) [ ] { }
  kEof,
};

struct Token {
  TokKind kind = TokKind::kEof;
  std::string text;  // kText, kName, kString, kOp: the text; numbers: their spelling
  int64_t int_value = 0;
  double float_value = 0.0;
  int line = 1;      // 1-based line in the template source
};

struct LexerOptions {
  bool trim_blocks = true;    // drop the first newline after a block or comment tag
  bool lstrip_blocks = true;  // drop spaces/tabs before a block or comment tag at line start
  bool keep_trailing_newline = false;
};

// Tokenizes `source`; fails with the line number on an unclosed tag, comment or string, or an
// unexpected character.
Result<std::vector<Token>> lex_template(std::string_view source, const LexerOptions& options);

}  // namespace oscar::jinja
