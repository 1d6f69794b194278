// ToolCallConstraint and its JSON prefix automaton (see tool_constraint.h).
#include "engine/tool_constraint.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

namespace oscar::engine {

namespace {

bool is_space(unsigned char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }
bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
bool is_hex(unsigned char c) {
  return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

constexpr const char* kCallPrefix = "<tool_call>\n{\"name\": \"";
constexpr const char* kArgsKey = ", \"arguments\": ";
constexpr const char* kCallSuffix = "}\n</tool_call>";

}  // namespace

bool JsonObjectPrefix::after_value() {
  lex_ = depth_ == 0 ? Lex::kDone : Lex::kCommaOrClose;
  return true;
}

bool JsonObjectPrefix::number(unsigned char c) {
  switch (num_) {
    case Num::kMinus:
      if (c == '0')
        num_ = Num::kZero;
      else if (is_digit(c))
        num_ = Num::kInt;
      else
        return false;
      return true;
    case Num::kZero:
      if (c == '.')
        num_ = Num::kDot;
      else if (c == 'e' || c == 'E')
        num_ = Num::kE;
      else
        return false;
      return true;
    case Num::kInt:
      if (is_digit(c)) return true;
      if (c == '.')
        num_ = Num::kDot;
      else if (c == 'e' || c == 'E')
        num_ = Num::kE;
      else
        return false;
      return true;
    case Num::kDot:
      if (!is_digit(c)) return false;
      num_ = Num::kFrac;
      return true;
    case Num::kFrac:
      if (is_digit(c)) return true;
      if (c != 'e' && c != 'E') return false;
      num_ = Num::kE;
      return true;
    case Num::kE:
      if (c == '+' || c == '-')
        num_ = Num::kESign;
      else if (is_digit(c))
        num_ = Num::kExp;
      else
        return false;
      return true;
    case Num::kESign:
      if (!is_digit(c)) return false;
      num_ = Num::kExp;
      return true;
    case Num::kExp:
      return is_digit(c);
  }
  return false;
}

// Whitespace and the characters that open or separate values.
bool JsonObjectPrefix::structural(unsigned char c) {
  if (is_space(c)) return ++ws_run_ <= kMaxWhitespace;
  ws_run_ = 0;
  auto push = [&](char kind, Lex next) {
    if (depth_ >= kMaxDepth) return false;
    stack_[depth_++] = kind;
    lex_ = next;
    return true;
  };
  auto pop = [&](char kind) {
    if (depth_ == 0 || stack_[depth_ - 1] != kind) return false;
    --depth_;
    return after_value();
  };
  switch (lex_) {
    case Lex::kValue:
    case Lex::kValueOrClose:
      if (depth_ == 0) return c == '{' && push('O', Lex::kKeyOrClose);  // the top level
      if (c == ']' && lex_ == Lex::kValueOrClose) return pop('A');
      if (c == '{') return push('O', Lex::kKeyOrClose);
      if (c == '[') return push('A', Lex::kValueOrClose);
      if (c == '"') {
        lex_ = Lex::kString;
        in_key_ = false;
        return true;
      }
      if (c == '-' || is_digit(c)) {
        lex_ = Lex::kNumber;
        num_ = c == '-' ? Num::kMinus : c == '0' ? Num::kZero : Num::kInt;
        num_bytes_ = 1;
        return true;
      }
      if (c == 't' || c == 'f' || c == 'n') {
        lex_ = Lex::kLiteral;
        literal_ = c == 't' ? "true" : c == 'f' ? "false" : "null";
        lit_pos_ = 1;
        return true;
      }
      return false;
    case Lex::kKeyOrClose:
      if (c == '}') return pop('O');
      [[fallthrough]];
    case Lex::kKey:
      if (c != '"') return false;
      lex_ = Lex::kString;
      in_key_ = true;
      return true;
    case Lex::kColon:
      if (c != ':') return false;
      lex_ = Lex::kValue;
      return true;
    case Lex::kCommaOrClose:
      if (c == ',') {
        lex_ = stack_[depth_ - 1] == 'O' ? Lex::kKey : Lex::kValue;
        return true;
      }
      if (c == '}') return pop('O');
      if (c == ']') return pop('A');
      return false;
    default:
      return false;
  }
}

bool JsonObjectPrefix::feed(unsigned char c) {
  switch (lex_) {
    case Lex::kDone:
      return false;
    case Lex::kString:
      if (utf8_left_ > 0) {
        if (c < utf8_lo_ || c > utf8_hi_) return false;
        --utf8_left_;
        utf8_lo_ = 0x80;
        utf8_hi_ = 0xBF;
        return true;
      }
      if (c == '"') {
        if (in_key_) {
          lex_ = Lex::kColon;
          return true;
        }
        return after_value();
      }
      if (c == '\\') {
        lex_ = Lex::kEscape;
        return true;
      }
      if (c < 0x20) return false;
      if (c < 0x80) return true;
      // UTF-8 lead bytes, with the ranges of the first continuation that exclude overlong forms,
      // surrogates and code points above U+10FFFF.
      if (c >= 0xC2 && c <= 0xDF) {
        utf8_left_ = 1;
      } else if (c >= 0xE0 && c <= 0xEF) {
        utf8_left_ = 2;
        if (c == 0xE0) utf8_lo_ = 0xA0;
        if (c == 0xED) utf8_hi_ = 0x9F;
      } else if (c >= 0xF0 && c <= 0xF4) {
        utf8_left_ = 3;
        if (c == 0xF0) utf8_lo_ = 0x90;
        if (c == 0xF4) utf8_hi_ = 0x8F;
      } else {
        return false;
      }
      return true;
    case Lex::kEscape:
      if (c == 'u') {
        lex_ = Lex::kHex;
        hex_pos_ = 0;
        return true;
      }
      if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' ||
          c == 't') {
        lex_ = Lex::kString;
        return true;
      }
      return false;
    case Lex::kHex:
      if (!is_hex(c)) return false;
      // \uD800-\uDFFF (surrogates) need a pair; refusing them keeps every escape valid alone.
      if (hex_pos_ == 0) hex_high_d_ = c == 'd' || c == 'D';
      if (hex_pos_ == 1 && hex_high_d_ && !(is_digit(c) && c < '8')) return false;
      if (++hex_pos_ == 4) lex_ = Lex::kString;
      return true;
    case Lex::kNumber:
      if (num_bytes_ < kMaxNumberBytes && number(c)) {
        ++num_bytes_;
        return true;
      }
      if (num_ != Num::kZero && num_ != Num::kInt && num_ != Num::kFrac && num_ != Num::kExp)
        return false;
      after_value();  // the number ends here; c is structural
      return lex_ != Lex::kDone && structural(c);
    case Lex::kLiteral:
      if (c != static_cast<unsigned char>(literal_[lit_pos_])) return false;
      if (literal_[++lit_pos_] == '\0') return after_value();
      return true;
    default:
      return structural(c);
  }
}

std::string JsonObjectPrefix::closing() const {
  std::string out;
  switch (lex_) {
    case Lex::kDone:
      return out;
    case Lex::kString:
      for (uint8_t i = 0; i < utf8_left_; ++i) out += static_cast<char>(i == 0 ? utf8_lo_ : 0x80);
      out += in_key_ ? "\":null" : "\"";
      break;
    case Lex::kEscape:
      out += in_key_ ? "n\":null" : "n\"";
      break;
    case Lex::kHex:
      out.append(4 - hex_pos_, '0');
      out += in_key_ ? "\":null" : "\"";
      break;
    case Lex::kNumber:
      if (num_ == Num::kMinus || num_ == Num::kDot || num_ == Num::kE || num_ == Num::kESign)
        out += "0";
      break;
    case Lex::kLiteral:
      out += literal_ + lit_pos_;
      break;
    case Lex::kValue:
      out += depth_ == 0 ? "{}" : "null";
      if (depth_ == 0) return out;
      break;
    case Lex::kValueOrClose:
    case Lex::kKeyOrClose:
    case Lex::kCommaOrClose:
      break;
    case Lex::kKey:
      out += "\"\":null";
      break;
    case Lex::kColon:
      out += ":null";
      break;
  }
  for (int d = depth_ - 1; d >= 0; --d) out += stack_[d] == 'O' ? '}' : ']';
  return out;
}

int64_t JsonObjectPrefix::closing_size() const {
  int64_t n = depth_;  // one closer per open container
  switch (lex_) {
    case Lex::kDone:
      return 0;
    case Lex::kString:
      return n + utf8_left_ + (in_key_ ? 6 : 1);
    case Lex::kEscape:
      return n + (in_key_ ? 7 : 2);
    case Lex::kHex:
      return n + (4 - hex_pos_) + (in_key_ ? 6 : 1);
    case Lex::kNumber:
      return n +
             (num_ == Num::kMinus || num_ == Num::kDot || num_ == Num::kE || num_ == Num::kESign);
    case Lex::kLiteral:
      return n + static_cast<int64_t>(std::strlen(literal_)) - lit_pos_;
    case Lex::kValue:
      return depth_ == 0 ? 2 : n + 4;
    case Lex::kValueOrClose:
    case Lex::kKeyOrClose:
    case Lex::kCommaOrClose:
      return n;
    case Lex::kKey:
      return n + 7;
    case Lex::kColon:
      return n + 5;
  }
  return n;
}

namespace {

// Whole characters of JSON string content, as the schema machine takes them (json_schema.cpp).
bool plain_string_bytes(const std::string& b) {
  if (b.empty()) return false;
  for (size_t i = 0; i < b.size();) {
    const unsigned char c = static_cast<unsigned char>(b[i]);
    if (c < 0x80) {
      if (c < 0x20 || c == '"' || c == '\\') return false;
      ++i;
      continue;
    }
    int n = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
      n = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
      n = 2;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      n = 3;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      return false;
    }
    if (i + 1 + static_cast<size_t>(n) > b.size()) return false;
    for (int k = 1; k <= n; ++k) {
      const unsigned char d = static_cast<unsigned char>(b[i + static_cast<size_t>(k)]);
      if (d < lo || d > hi) return false;
      lo = 0x80;
      hi = 0xBF;
    }
    i += 1 + static_cast<size_t>(n);
  }
  return true;
}

// A trie over ids (sorted by their bytes).
void build_trie(const std::vector<std::string>& bytes, const std::vector<int32_t>& ids,
                TokenTrie::Trie* t) {
  // The node of the tokens ids[lo, hi), which share their first `depth` bytes.
  auto build_node = [&](auto& self, size_t lo, size_t hi, size_t depth) -> uint32_t {
    const uint32_t id = static_cast<uint32_t>(t->nodes.size());
    t->nodes.emplace_back();
    t->nodes[id].first_token = static_cast<uint32_t>(t->tokens.size());
    while (lo < hi && bytes[static_cast<size_t>(ids[lo])].size() == depth)
      t->tokens.push_back(ids[lo++]);
    t->nodes[id].n_tokens = static_cast<uint32_t>(t->tokens.size()) - t->nodes[id].first_token;
    std::vector<std::pair<size_t, size_t>> groups;  // by the byte at depth
    for (size_t i = lo; i < hi;) {
      size_t j = i;
      const char c = bytes[static_cast<size_t>(ids[i])][depth];
      while (j < hi && bytes[static_cast<size_t>(ids[j])][depth] == c) ++j;
      groups.push_back({i, j});
      i = j;
    }
    const uint32_t first = static_cast<uint32_t>(t->edge_byte.size());
    t->nodes[id].first_edge = first;
    t->nodes[id].n_edges = static_cast<uint32_t>(groups.size());
    t->edge_byte.resize(first + groups.size());
    t->edge_child.resize(first + groups.size());
    for (size_t g = 0; g < groups.size(); ++g) {
      t->edge_byte[first + g] =
          static_cast<uint8_t>(bytes[static_cast<size_t>(ids[groups[g].first])][depth]);
      const uint32_t child = self(self, groups[g].first, groups[g].second, depth + 1);
      t->edge_child[first + g] = child;
    }
    return id;
  };
  build_node(build_node, 0, ids.size(), 0);
}

}  // namespace

std::shared_ptr<const TokenTrie> TokenTrie::build(const tok::Tokenizer& tokenizer) {
  auto t = std::make_shared<TokenTrie>();
  const int32_t vocab = tokenizer.vocab_size();
  t->bytes.resize(static_cast<size_t>(vocab));
  std::vector<int32_t> ids, special;
  for (int32_t i = 0; i < vocab; ++i) {
    if (tokenizer.is_added(i)) continue;
    std::string& b = t->bytes[static_cast<size_t>(i)];
    b = std::string(tokenizer.token_bytes(i));
    if (b.empty()) continue;
    ids.push_back(i);
    (plain_string_bytes(b) ? t->plain : special).push_back(i);
    t->max_token_bytes = std::max(t->max_token_bytes, b.size());
  }
  auto by_bytes = [&](int32_t a, int32_t b) {
    return t->bytes[static_cast<size_t>(a)] < t->bytes[static_cast<size_t>(b)];
  };
  std::sort(ids.begin(), ids.end(), by_bytes);
  std::sort(special.begin(), special.end(), by_bytes);
  build_trie(t->bytes, ids, &t->all);
  build_trie(t->bytes, special, &t->special);
  return t;
}

void ToolCallConstraint::init(const tok::Tokenizer& tokenizer,
                              std::shared_ptr<const TokenTrie> vocab) {
  vocab_ = vocab ? std::move(vocab) : TokenTrie::build(tokenizer);
  bytes_ = &vocab_->bytes;
  eos_ = tokenizer.eos_token_id().value_or(-1);
}

Result<std::unique_ptr<ToolCallConstraint>> ToolCallConstraint::create(
    const tok::Tokenizer& tokenizer, const std::vector<std::string>& names,
    const std::vector<std::shared_ptr<const JsonSchema>>& schemas,
    std::shared_ptr<const TokenTrie> vocab) {
  if (names.empty()) return invalid_argument("tool call constraint: no function names");
  if (!schemas.empty() && schemas.size() != names.size())
    return invalid_argument("tool call constraint: %zu schemas for %zu names", schemas.size(),
                            names.size());
  std::unique_ptr<ToolCallConstraint> c(new ToolCallConstraint());
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string& name = names[i];
    if (name.empty()) return invalid_argument("tool call constraint: an empty function name");
    const std::shared_ptr<const JsonSchema> schema = schemas.empty() ? nullptr : schemas[i];
    if (schema && !schema->root_is_object())
      return invalid_argument("tool call constraint: the arguments of '%s' must be an object",
                              name.c_str());
    const std::string quoted =
        nlohmann::json(name).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    std::string target = quoted.substr(1) + kArgsKey;  // `name", "arguments": `
    if (std::find(c->targets_.begin(), c->targets_.end(), target) == c->targets_.end()) {
      c->targets_.push_back(std::move(target));
      c->target_schemas_.push_back(schema);
    }
  }
  c->init(tokenizer, std::move(vocab));
  c->prefix_ = tokenizer.encode(kCallPrefix);
  c->suffix_ = tokenizer.encode(kCallSuffix);
  if (c->prefix_.empty() || c->suffix_.empty())
    return internal_error("tool call constraint: the tokenizer encodes the call's tags to nothing");
  return c;
}

Result<std::unique_ptr<ToolCallConstraint>> ToolCallConstraint::create_on_call(
    const tok::Tokenizer& tokenizer, const std::vector<std::string>& names,
    const std::vector<std::shared_ptr<const JsonSchema>>& schemas,
    std::shared_ptr<const TokenTrie> vocab) {
  OSCAR_ASSIGN_OR_RETURN(std::unique_ptr<ToolCallConstraint> c,
                         create(tokenizer, names, schemas, std::move(vocab)));
  const std::string_view tag = "<tool_call>";
  if (tokenizer.token_bytes(c->prefix_[0]) != tag)
    return invalid_argument("tool calls under tool_choice \"auto\" follow their strict schemas "
                            "only with a tokenizer that has a single %.*s token",
                            static_cast<int>(tag.size()), tag.data());
  c->phase_ = Phase::kWaiting;
  return c;
}

std::unique_ptr<ToolCallConstraint> ToolCallConstraint::create_json_object(
    const tok::Tokenizer& tokenizer, std::shared_ptr<const TokenTrie> vocab) {
  std::unique_ptr<ToolCallConstraint> c(new ToolCallConstraint());
  c->init(tokenizer, std::move(vocab));
  c->phase_ = Phase::kArgs;  // no prefix, no name; no suffix after the object
  return c;
}

std::unique_ptr<ToolCallConstraint> ToolCallConstraint::create_json_schema(
    const tok::Tokenizer& tokenizer, std::shared_ptr<const JsonSchema> schema,
    std::shared_ptr<const TokenTrie> vocab) {
  std::unique_ptr<ToolCallConstraint> c(new ToolCallConstraint());
  c->init(tokenizer, std::move(vocab));
  c->start_args(std::move(schema));
  return c;
}

void ToolCallConstraint::start_args(std::shared_ptr<const JsonSchema> schema) {
  phase_ = Phase::kArgs;
  schema_ = std::move(schema);
  if (schema_) doc_ = JsonSchemaPrefix(schema_.get());
}

bool ToolCallConstraint::name_allows(std::string_view bytes) const {
  if (bytes.empty()) return false;
  const std::string s = name_ + std::string(bytes);
  for (const std::string& t : targets_)
    if (t.size() >= s.size() && t.compare(0, s.size(), s) == 0) return true;
  return false;
}

// Each token under trie node `node` (whose bytes levels_[depth] has taken): its shortest
// completion in cost_, or -1 where the machine refuses a byte.
void ToolCallConstraint::walk(const TokenTrie::Trie& t, uint32_t node, size_t depth) const {
  const TokenTrie::Node& n = t.nodes[node];
  for (uint32_t e = n.first_edge; e < n.first_edge + n.n_edges; ++e) {
    JsonSchemaPrefix& next = levels_[depth + 1];
    if (!levels_[depth].feed_into(t.edge_byte[e], &next)) continue;
    const TokenTrie::Node& child = t.nodes[t.edge_child[e]];
    if (child.n_tokens > 0) {
      const int64_t cost = next.min_completion();
      for (uint32_t k = child.first_token; k < child.first_token + child.n_tokens; ++k)
        cost_[static_cast<size_t>(t.tokens[k])] = cost;
    }
    // The document may close only at a token's last byte.
    if (child.n_edges > 0 && !next.complete()) walk(t, t.edge_child[e], depth + 1);
  }
}

void ToolCallConstraint::schema_allowed(std::vector<uint8_t>* allowed, int64_t room) const {
  const size_t vocab = bytes_->size();
  cost_.assign(vocab, -1);
  if (levels_.size() < vocab_->max_token_bytes + 1) levels_.resize(vocab_->max_token_bytes + 1);
  levels_[0] = doc_;
  if (doc_.in_free_string()) {
    const int64_t cost = doc_.min_completion();
    for (int32_t t : vocab_->plain) cost_[static_cast<size_t>(t)] = cost;
    walk(vocab_->special, 0, 0);
  } else {
    walk(vocab_->all, 0, 0);
  }
  // The budget rule of the object machine, with min_completion() for closing_size().
  int64_t shortest = -1;
  bool any = false;
  for (size_t t = 0; t < vocab; ++t) {
    const int64_t n = cost_[t];
    if (n < 0) continue;
    if (shortest < 0 || n < shortest) shortest = n;
    (*allowed)[t] = n <= room;
    any = any || n <= room;
  }
  if (!any && shortest >= 0)
    for (size_t t = 0; t < vocab; ++t) (*allowed)[t] = cost_[t] == shortest;
  // A top-level value that may end here (or go on, as a number can) ends with end-of-sequence.
  if (eos_ >= 0 && static_cast<size_t>(eos_) < vocab && doc_.can_end())
    (*allowed)[static_cast<size_t>(eos_)] = 1;
}

void ToolCallConstraint::allowed_tokens(std::vector<uint8_t>* allowed, int64_t tokens_left) const {
  const int32_t vocab = static_cast<int32_t>(bytes_->size());
  const std::vector<std::string>& bytes = *bytes_;
  allowed->assign(vocab, phase_ == Phase::kWaiting ? 1 : 0);
  switch (phase_) {
    case Phase::kWaiting:
      return;
    case Phase::kPrefix:
      (*allowed)[prefix_[forced_pos_]] = 1;
      return;
    case Phase::kSuffix:
      (*allowed)[suffix_[forced_pos_]] = 1;
      return;
    case Phase::kName:
      for (int32_t t = 0; t < vocab; ++t) (*allowed)[t] = name_allows(bytes[t]);
      return;
    case Phase::kArgs: {
      // A token is allowed when the text stays a JSON object prefix and the shortest completion
      // after it still fits the tokens left (one per byte, then the forced end): the call can
      // always close within the budget, since the first byte of closing() is always allowed.
      // When even that does not fit (the budget ran out with the name: max_tokens too small for
      // any whole call), the tokens whose completion is shortest: the call is then cut by
      // max_tokens (finish_reason "length") as when the name does not fit, rather than a mask
      // that allows nothing.
      const int64_t room = tokens_left - 1 - static_cast<int64_t>(suffix_.size());
      if (schema_) return schema_allowed(allowed, room);
      auto closing_after = [&](int32_t t) -> int64_t {  // -1: the token breaks the object
        const std::string& b = bytes[t];
        if (b.empty()) return -1;
        JsonObjectPrefix probe = json_;
        for (size_t i = 0; i < b.size(); ++i) {
          // The object may close only at the token's last byte.
          if (probe.complete() || !probe.feed(static_cast<unsigned char>(b[i]))) return -1;
        }
        return probe.closing_size();
      };
      int64_t shortest = -1;
      bool any = false;
      for (int32_t t = 0; t < vocab; ++t) {
        const int64_t n = closing_after(t);
        if (n < 0) continue;
        if (shortest < 0 || n < shortest) shortest = n;
        (*allowed)[t] = n <= room;
        any = any || n <= room;
      }
      if (!any && shortest >= 0)
        for (int32_t t = 0; t < vocab; ++t) (*allowed)[t] = closing_after(t) == shortest;
      return;
    }
    case Phase::kDone:
      return;
  }
}

bool ToolCallConstraint::advance(int32_t token) {
  if (token < 0 || token >= static_cast<int32_t>(bytes_->size())) return false;
  const std::string& b = (*bytes_)[static_cast<size_t>(token)];
  switch (phase_) {
    case Phase::kWaiting:  // free text; the tag's token starts the call
      if (token == prefix_[0]) {
        phase_ = prefix_.size() == 1 ? Phase::kName : Phase::kPrefix;
        forced_pos_ = prefix_.size() == 1 ? 0 : 1;
      }
      return true;
    case Phase::kPrefix:
      if (token != prefix_[forced_pos_]) return false;
      if (++forced_pos_ == prefix_.size()) {
        phase_ = Phase::kName;
        forced_pos_ = 0;
      }
      return true;
    case Phase::kName: {
      if (!name_allows(b)) return false;
      name_ += b;
      const auto it = std::find(targets_.begin(), targets_.end(), name_);
      if (it != targets_.end())
        start_args(target_schemas_[static_cast<size_t>(it - targets_.begin())]);
      return true;
    }
    case Phase::kArgs: {
      if (schema_) {
        if (token == eos_ && doc_.can_end()) {
          phase_ = Phase::kDone;
          return true;
        }
        if (b.empty()) return false;
        JsonSchemaPrefix next = doc_;
        for (char ch : b)
          if (next.complete() || !next.feed(static_cast<unsigned char>(ch))) return false;
        doc_ = std::move(next);
        if (doc_.complete()) phase_ = suffix_.empty() ? Phase::kDone : Phase::kSuffix;
        return true;
      }
      if (b.empty()) return false;
      JsonObjectPrefix next = json_;
      for (char ch : b)
        if (next.complete() || !next.feed(static_cast<unsigned char>(ch))) return false;
      json_ = next;
      if (json_.complete()) phase_ = suffix_.empty() ? Phase::kDone : Phase::kSuffix;
      return true;
    }
    case Phase::kSuffix:
      if (token != suffix_[forced_pos_]) return false;
      if (++forced_pos_ == suffix_.size()) phase_ = Phase::kDone;
      return true;
    case Phase::kDone:
      return false;
  }
  return false;
}

}  // namespace oscar::engine
