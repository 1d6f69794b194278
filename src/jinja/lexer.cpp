// Lexer of the Jinja2 subset; mirrors the rules of jinja2/lexer.py (see jinja/lexer.h).
#include "jinja/lexer.h"

#include <cerrno>
#include <cstdlib>

#include "jinja/value.h"

namespace oscar::jinja {
namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }
int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Python's "unicode-escape" decoding of a string literal body; unknown escapes stay as written.
std::string decode_escapes(std::string_view body) {
  std::string out;
  out.reserve(body.size());
  for (size_t k = 0; k < body.size(); ++k) {
    char c = body[k];
    if (c != '\\' || k + 1 >= body.size()) {
      out += c;
      continue;
    }
    char e = body[++k];
    switch (e) {
      case '\n': break;  // line continuation
      case '\\': out += '\\'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case 'a': out += '\a'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'n': out += '\n'; break;
      case 'r': out += '\r'; break;
      case 't': out += '\t'; break;
      case 'v': out += '\v'; break;
      case 'x':
      case 'u':
      case 'U': {
        size_t width = e == 'x' ? 2 : (e == 'u' ? 4 : 8);
        char32_t cp = 0;
        bool ok = true;
        for (size_t t = 1; ok && t <= width; ++t) {
          if (k + t >= body.size() || hex_value(body[k + t]) < 0) {
            ok = false;
            break;
          }
          cp = cp * 16 + static_cast<char32_t>(hex_value(body[k + t]));
        }
        if (!ok || cp > 0x10FFFF) {
          out += '\\';
          out += e;
          break;
        }
        utf8::append(out, cp);
        k += width;
        break;
      }
      default:
        if (e >= '0' && e <= '7') {
          int value = e - '0';
          for (int t = 0; t < 2 && k + 1 < body.size() && body[k + 1] >= '0' && body[k + 1] <= '7';
               ++t) {
            value = value * 8 + (body[++k] - '0');
          }
          utf8::append(out, static_cast<char32_t>(value));
        } else {
          out += '\\';
          out += e;
        }
    }
  }
  return out;
}

class Lexer {
 public:
  Lexer(std::string src, const LexerOptions& opt) : src_(std::move(src)), opt_(opt) {}

  Result<std::vector<Token>> run() {
    size_t n = src_.size();
    while (pos_ < n) {
      size_t t = find_tag(pos_);
      if (t == std::string::npos) {
        emit_text(src_.substr(pos_), line_);
        break;
      }
      char kind = src_[t + 1];
      char sign = (t + 2 < n && (src_[t + 2] == '-' || src_[t + 2] == '+')) ? src_[t + 2] : 0;
      std::string text = src_.substr(pos_, t - pos_);
      int text_line = line_;
      strip_text(text, sign, kind != '{');
      emit_text(std::move(text), text_line);
      advance_to(t);
      int tag_line = line_;
      size_t body = t + 2 + (sign ? 1 : 0);
      if (kind == '#') {
        OSCAR_RETURN_IF_ERROR(lex_comment(body, tag_line));
      } else if (kind == '%' && is_raw_begin(body)) {
        OSCAR_RETURN_IF_ERROR(lex_raw(tag_line));
      } else {
        OSCAR_RETURN_IF_ERROR(lex_tag(kind == '%', body, tag_line));
      }
    }
    Token eof;
    eof.kind = TokKind::kEof;
    eof.line = line_;
    tokens_.push_back(eof);
    return std::move(tokens_);
  }

 private:
  size_t find_tag(size_t from) const {
    size_t k = from;
    while (true) {
      k = src_.find('{', k);
      if (k == std::string::npos || k + 1 >= src_.size()) return std::string::npos;
      char c = src_[k + 1];
      if (c == '{' || c == '%' || c == '#') return k;
      ++k;
    }
  }

  void advance_to(size_t p) {
    for (size_t k = pos_; k < p && k < src_.size(); ++k) {
      if (src_[k] == '\n') ++line_;
    }
    pos_ = p;
  }

  // Jinja's OptionalLStrip handling of the text before a tag.
  void strip_text(std::string& text, char sign, bool block_or_comment) {
    if (sign == '-') {
      size_t e = text.size();
      while (e > 0 && is_space(text[e - 1])) --e;
      text.resize(e);
    } else if (sign != '+' && opt_.lstrip_blocks && block_or_comment) {
      size_t nl = text.rfind('\n');
      size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
      if (l_pos > 0 || line_starting_) {
        bool all_space = true;
        for (size_t k = l_pos; k < text.size(); ++k) all_space = all_space && is_space(text[k]);
        if (all_space) text.resize(l_pos);
      }
    }
  }

  void emit_text(std::string text, int line) {
    if (text.empty()) return;
    Token tok;
    tok.kind = TokKind::kText;
    tok.text = std::move(text);
    tok.line = line;
    tokens_.push_back(std::move(tok));
  }

  void push(TokKind kind, std::string text, int line) {
    Token tok;
    tok.kind = kind;
    tok.text = std::move(text);
    tok.line = line;
    tokens_.push_back(std::move(tok));
  }

  // After a tag end: `-` eats all following whitespace; trim_blocks eats one newline.
  void finish_tag_end(size_t after, bool strip_ws, bool trim_newline) {
    size_t p = after;
    if (strip_ws) {
      while (p < src_.size() && is_space(src_[p])) ++p;
    } else if (trim_newline && p < src_.size() && src_[p] == '\n') {
      ++p;
    }
    line_starting_ = p > 0 && src_[p - 1] == '\n';
    advance_to(p);
  }

  Status lex_comment(size_t body, int tag_line) {
    size_t e = src_.find("#}", body);
    if (e == std::string::npos) {
      return invalid_argument("chat template: line %d: unclosed comment '{#'", tag_line);
    }
    bool strip = e > body && src_[e - 1] == '-';
    finish_tag_end(e + 2, strip, opt_.trim_blocks);
    return Status();
  }

  // `{%[-+]? raw [-]?%}` at the tag body?
  bool is_raw_begin(size_t body) const {
    size_t p = body;
    while (p < src_.size() && is_space(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    while (p < src_.size() && is_space(src_[p])) ++p;
    return src_.compare(p, 2, "%}") == 0 || src_.compare(p, 3, "-%}") == 0;
  }

  Status lex_raw(int tag_line) {
    // Skip the raw begin tag (no trim_blocks newline after it, as in Jinja).
    size_t p = src_.find("raw", pos_) + 3;
    while (is_space(src_[p])) ++p;
    bool strip = src_[p] == '-';
    p += strip ? 3 : 2;
    finish_tag_end(p, strip, false);
    // Find `{%[-+]? endraw [-+]?%}`.
    size_t search = pos_;
    while (true) {
      size_t t = src_.find("{%", search);
      if (t == std::string::npos) {
        return invalid_argument("chat template: line %d: unclosed '{%% raw %%}'", tag_line);
      }
      size_t q = t + 2;
      char sign = (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) ? src_[q] : 0;
      if (sign) ++q;
      while (q < src_.size() && is_space(src_[q])) ++q;
      if (src_.compare(q, 6, "endraw") != 0) {
        search = t + 2;
        continue;
      }
      q += 6;
      while (q < src_.size() && is_space(src_[q])) ++q;
      char end_sign = 0;
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) end_sign = src_[q++];
      if (src_.compare(q, 2, "%}") != 0) {
        search = t + 2;
        continue;
      }
      std::string text = src_.substr(pos_, t - pos_);
      int text_line = line_;
      strip_text(text, sign, true);
      emit_text(std::move(text), text_line);
      advance_to(t);
      finish_tag_end(q + 2, end_sign == '-', end_sign != '+' && opt_.trim_blocks);
      return Status();
    }
  }

  Status lex_tag(bool block, size_t body, int tag_line) {
    push(block ? TokKind::kBlockBegin : TokKind::kVarBegin, block ? "{%" : "{{", tag_line);
    advance_to(body);
    std::string balance;
    const char* what = block ? "'{%'" : "'{{'";
    while (true) {
      while (pos_ < src_.size() && is_space(src_[pos_])) advance_to(pos_ + 1);
      if (pos_ >= src_.size()) {
        return invalid_argument("chat template: line %d: unclosed tag %s (end of template)",
                                tag_line, what);
      }
      if (balance.empty()) {
        if (block) {
          if (src_.compare(pos_, 3, "+%}") == 0) {
            push(TokKind::kBlockEnd, "%}", line_);
            finish_tag_end(pos_ + 3, false, false);
            return Status();
          }
          if (src_.compare(pos_, 3, "-%}") == 0) {
            push(TokKind::kBlockEnd, "%}", line_);
            finish_tag_end(pos_ + 3, true, false);
            return Status();
          }
          if (src_.compare(pos_, 2, "%}") == 0) {
            push(TokKind::kBlockEnd, "%}", line_);
            finish_tag_end(pos_ + 2, false, opt_.trim_blocks);
            return Status();
          }
        } else {
          if (src_.compare(pos_, 3, "-}}") == 0) {
            push(TokKind::kVarEnd, "}}", line_);
            finish_tag_end(pos_ + 3, true, false);
            return Status();
          }
          if (src_.compare(pos_, 2, "}}") == 0) {
            push(TokKind::kVarEnd, "}}", line_);
            finish_tag_end(pos_ + 2, false, false);
            return Status();
          }
        }
      }
      OSCAR_RETURN_IF_ERROR(lex_one(balance));
    }
  }

  Status lex_one(std::string& balance) {
    char c = src_[pos_];
    int line = line_;
    size_t n = src_.size();
    if (is_name_start(c)) {
      size_t e = pos_;
      while (e < n && is_name_char(src_[e])) ++e;
      push(TokKind::kName, src_.substr(pos_, e - pos_), line);
      advance_to(e);
      return Status();
    }
    if (is_digit(c)) return lex_number();
    if (c == '\'' || c == '"') {
      size_t e = pos_ + 1;
      while (e < n && src_[e] != c) {
        if (src_[e] == '\\') ++e;
        ++e;
      }
      if (e >= n) return invalid_argument("chat template: line %d: unterminated string", line);
      push(TokKind::kString, decode_escapes(std::string_view(src_).substr(pos_ + 1, e - pos_ - 1)),
           line);
      advance_to(e + 1);
      return Status();
    }
    static const char* kTwo[] = {"//", "**", "==", "!=", "<=", ">="};
    for (const char* op : kTwo) {
      if (src_.compare(pos_, 2, op) == 0) {
        push(TokKind::kOp, op, line);
        advance_to(pos_ + 2);
        return Status();
      }
    }
    static const std::string kOne = "+-*/%~<>=.:|,()[]{};";
    if (kOne.find(c) == std::string::npos) {
      return invalid_argument("chat template: line %d: unexpected character '%c'", line, c);
    }
    if (c == '(' || c == '[' || c == '{') {
      if (balance.size() >= 256) {
        return out_of_range("chat template: line %d: brackets nested too deeply", line);
      }
      balance += c;
    } else if (c == ')' || c == ']' || c == '}') {
      char open = c == ')' ? '(' : (c == ']' ? '[' : '{');
      if (balance.empty()) {
        return invalid_argument("chat template: line %d: unexpected '%c'", line, c);
      }
      if (balance.back() != open) {
        char want = balance.back() == '(' ? ')' : (balance.back() == '[' ? ']' : '}');
        return invalid_argument("chat template: line %d: unexpected '%c', expected '%c'", line,
                                c, want);
      }
      balance.pop_back();
    }
    push(TokKind::kOp, std::string(1, c), line);
    advance_to(pos_ + 1);
    return Status();
  }

  Status lex_number() {
    size_t n = src_.size();
    size_t e = pos_;
    auto digits = [&](size_t p) {
      while (p < n && (is_digit(src_[p]) || (src_[p] == '_' && p + 1 < n && is_digit(src_[p + 1]))))
        ++p;
      return p;
    };
    e = digits(e);
    bool is_float = false;
    bool after_dot = !tokens_.empty() && tokens_.back().kind == TokKind::kOp &&
                     tokens_.back().text == ".";
    if (!after_dot) {
      if (e + 1 < n && src_[e] == '.' && is_digit(src_[e + 1])) {
        is_float = true;
        e = digits(e + 1);
      }
      if (e < n && (src_[e] == 'e' || src_[e] == 'E')) {
        size_t q = e + 1;
        if (q < n && (src_[q] == '+' || src_[q] == '-')) ++q;
        if (q < n && is_digit(src_[q])) {
          is_float = true;
          e = digits(q);
        }
      }
    }
    std::string spelling;
    for (size_t k = pos_; k < e; ++k) {
      if (src_[k] != '_') spelling += src_[k];
    }
    Token tok;
    tok.line = line_;
    tok.text = spelling;
    errno = 0;
    if (is_float) {
      tok.kind = TokKind::kFloat;
      tok.float_value = std::strtod(spelling.c_str(), nullptr);
    } else {
      tok.kind = TokKind::kInt;
      tok.int_value = std::strtoll(spelling.c_str(), nullptr, 10);
      if (errno == ERANGE) {
        return out_of_range("chat template: line %d: integer literal %s is too large", line_,
                            spelling.c_str());
      }
    }
    tokens_.push_back(std::move(tok));
    advance_to(e);
    return Status();
  }

  std::string src_;
  LexerOptions opt_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;
  std::vector<Token> tokens_;
};

}  // namespace

Result<std::vector<Token>> lex_template(std::string_view source, const LexerOptions& options) {
  // Jinja normalises \r\n and \r to \n and, unless keep_trailing_newline, drops one final \n.
  std::string src;
  src.reserve(source.size());
  for (size_t k = 0; k < source.size(); ++k) {
    if (source[k] == '\r') {
      src += '\n';
      if (k + 1 < source.size() && source[k + 1] == '\n') ++k;
    } else {
      src += source[k];
    }
  }
  if (!options.keep_trailing_newline && !src.empty() && src.back() == '\n') src.pop_back();
  return Lexer(std::move(src), options).run();
}

}  // namespace oscar::jinja
