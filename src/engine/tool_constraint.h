// ToolCallConstraint: constrained decoding that makes a chat answer exactly one tool call in the
// format Qwen3's chat template teaches (hermes style) and server/output_parser.h parses:
//
//   <tool_call>\n{"name": "<one of the names>", "arguments": <a JSON object>}\n</tool_call>
//
// tool_choice "required" passes every tool's name, a named tool_choice its one name. What is
// constrained, token by token (allowed_tokens() is the mask the scheduler applies to the logits):
//   1. `<tool_call>\n{"name": "` is forced, as the tokenizer encodes it (Qwen3: the <tool_call>
//      token, then text);
//   2. the name: only tokens that keep the text a prefix of `<name>", "arguments": ` for some
//      allowed name (the name JSON-escaped), until one is complete;
//   3. the arguments: only tokens that keep the text a prefix of a JSON object (RFC 8259: strings
//      with valid escapes and UTF-8, numbers, literals, nesting up to kMaxDepth, at most
//      kMaxWhitespace whitespace bytes in a row), ending exactly where the object closes;
//   4. `}\n</tool_call>` is forced; then done() and the request ends.
// The call always fits the request's token budget when it can: an argument token is allowed only
// if the shortest completion after it (one token per byte of JsonObjectPrefix::closing(), then
// the forced end) still fits the tokens left.
// Added/special tokens are never allowed in 2 and 3, nor is the end-of-sequence token anywhere.
// Not constrained: the arguments' schema (types, required properties), which the model chooses,
// unless create() is given one for the name (strict tools, below); a
// max_tokens too small for the whole shortest call (the forced parts, the name, `{}`) cuts the
// call (finish_reason "length", left as content by the parser): past the name, the tokens on the
// shortest way to closing it are then allowed;
// one call only (no parallel calls); no reasoning (<think>) before the call.
//
// JSON mode (response_format {"type": "json_object"}, create_json_object): the same machine
// without the tags and the name: the whole output is step 3 alone, one JSON object, closing within
// the budget, after which the request ends.
//
// Structured outputs (response_format json_schema, create_json_schema): the whole output is one
// document valid under a compiled JsonSchema (engine/json_schema.h says which documents), closing
// within the budget the same way (JsonSchemaPrefix::min_completion() in place of closing()).
// A top-level value that may go on (a number) ends with the end-of-sequence token, which is then
// allowed; every other top-level value ends the request where it closes. Strict tool calls:
// create() with a schema for a name makes that call's arguments follow it.
// The schema machine is probed along a byte trie of the vocabulary (TokenTrie): a prefix shared by
// many tokens is fed once, and a refused prefix drops every token under it.
//
// Single-threaded (one per sequence, on the scheduler's thread). The tokenizer outlives it.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "engine/json_schema.h"
#include "tokenizer/tokenizer.h"

namespace oscar::engine {

// Whether a byte string is a prefix of a JSON object text (a copyable value: probing a token is
// copy, feed its bytes). Public for its unit test.
class JsonObjectPrefix {
 public:
  static constexpr int kMaxDepth = 16;
  static constexpr int kMaxWhitespace = 16;
  static constexpr int kMaxNumberBytes = 64;

  // False: the byte makes the text no JSON object prefix (the state is then unspecified).
  bool feed(unsigned char c);
  // The top-level object is closed: any further byte is refused.
  bool complete() const { return lex_ == Lex::kDone; }
  // The shortest bytes that complete the object from here (an open string is closed, a key gets
  // `:null`, an expected value is `null`, then every open array and object is closed). Feeding a
  // prefix of it leaves the rest as the new closing().
  std::string closing() const;
  int64_t closing_size() const;  // closing().size(), without building it

 private:
  enum class Lex : uint8_t {
    kValue,         // a value (the top level: only an object)
    kValueOrClose,  // after '[': a value or ']'
    kKeyOrClose,    // after '{': a key or '}'
    kKey,           // after ',' in an object
    kColon,
    kCommaOrClose,
    kString,
    kEscape,
    kHex,
    kNumber,
    kLiteral,
    kDone,
  };
  enum class Num : uint8_t { kMinus, kZero, kInt, kDot, kFrac, kE, kESign, kExp };
  bool after_value();
  bool structural(unsigned char c);
  bool number(unsigned char c);

  std::array<char, kMaxDepth> stack_{};  // 'O' object, 'A' array
  int8_t depth_ = 0;
  Lex lex_ = Lex::kValue;
  bool in_key_ = false;
  Num num_ = Num::kInt;
  uint8_t num_bytes_ = 0;
  const char* literal_ = nullptr;  // "true", "false" or "null" while in kLiteral
  uint8_t lit_pos_ = 0;
  uint8_t hex_pos_ = 0;
  bool hex_high_d_ = false;  // \uD...: the next digit must keep it outside the surrogates
  uint8_t utf8_left_ = 0;    // continuation bytes still expected
  uint8_t utf8_lo_ = 0x80, utf8_hi_ = 0xBF;  // range of the next continuation byte
  uint8_t ws_run_ = 0;
};

// What each token decodes to ("" for added tokens) and byte tries over them. Immutable, shared by
// the constraints of one tokenizer (the scheduler builds it once).
struct TokenTrie {
  struct Node {
    uint32_t first_edge = 0, n_edges = 0;    // edges [first_edge, first_edge + n_edges)
    uint32_t first_token = 0, n_tokens = 0;  // tokens ending here, in `tokens`
  };
  struct Trie {
    std::vector<Node> nodes;  // nodes[0]: the root (the empty prefix)
    std::vector<uint8_t> edge_byte;
    std::vector<uint32_t> edge_child;
    std::vector<int32_t> tokens;
  };
  std::vector<std::string> bytes;  // [vocab]
  Trie all;                        // every non-empty token
  // Tokens that are whole characters of JSON string content (no quote, backslash, control byte
  // or partial UTF-8): inside a string without a length limit each leaves the machine where it
  // was, so they are allowed together and only the `special` trie (the others) is walked.
  std::vector<int32_t> plain;
  Trie special;
  size_t max_token_bytes = 0;

  static std::shared_ptr<const TokenTrie> build(const tok::Tokenizer& tokenizer);
};

class ToolCallConstraint {
 public:
  // names: the functions allowed (non-empty strings; duplicates are ignored). schemas: empty, or
  // one per name: the arguments of a call to names[i] follow schemas[i] (an object schema), any
  // JSON object where null. vocab: the tokenizer's TokenTrie (built here when null).
  static Result<std::unique_ptr<ToolCallConstraint>> create(
      const tok::Tokenizer& tokenizer, const std::vector<std::string>& names,
      const std::vector<std::shared_ptr<const JsonSchema>>& schemas = {},
      std::shared_ptr<const TokenTrie> vocab = nullptr);
  // tool_choice "auto" with strict tools: free text until the model starts a call by drawing the
  // call's opening tag (Qwen3's <tool_call> token), then that call as create()'s, which ends the
  // request. Refused (InvalidArgument) where the tokenizer has no single token for the tag: a
  // first piece such as "<" would start a call inside ordinary text.
  static Result<std::unique_ptr<ToolCallConstraint>> create_on_call(
      const tok::Tokenizer& tokenizer, const std::vector<std::string>& names,
      const std::vector<std::shared_ptr<const JsonSchema>>& schemas = {},
      std::shared_ptr<const TokenTrie> vocab = nullptr);
  // JSON mode: the output is one JSON object (no tags, no name).
  static std::unique_ptr<ToolCallConstraint> create_json_object(
      const tok::Tokenizer& tokenizer, std::shared_ptr<const TokenTrie> vocab = nullptr);
  // Structured outputs: the output is one document valid under schema (non-null).
  static std::unique_ptr<ToolCallConstraint> create_json_schema(
      const tok::Tokenizer& tokenizer, std::shared_ptr<const JsonSchema> schema,
      std::shared_ptr<const TokenTrie> vocab = nullptr);

  // allowed[t] = 1 for every token t that may come next (resized to the vocabulary), given the
  // tokens the request may still generate (this one included). At least one token is allowed
  // while !done().
  void allowed_tokens(std::vector<uint8_t>* allowed, int64_t tokens_left) const;
  // The token drawn. False (and no change) when allowed_tokens() did not allow it.
  bool advance(int32_t token);
  bool done() const { return phase_ == Phase::kDone; }
  // False while create_on_call's constraint waits for the call to start: every token may come
  // (allowed_tokens() allows all; the scheduler leaves the logits alone).
  bool active() const { return phase_ != Phase::kWaiting; }

 private:
  enum class Phase { kWaiting, kPrefix, kName, kArgs, kSuffix, kDone };
  ToolCallConstraint() = default;
  void init(const tok::Tokenizer& tokenizer, std::shared_ptr<const TokenTrie> vocab);
  bool name_allows(std::string_view bytes) const;
  void start_args(std::shared_ptr<const JsonSchema> schema);
  void schema_allowed(std::vector<uint8_t>* allowed, int64_t room) const;
  void walk(const TokenTrie::Trie& trie, uint32_t node, size_t depth) const;

  std::shared_ptr<const TokenTrie> vocab_;
  const std::vector<std::string>* bytes_ = nullptr;  // vocab_->bytes
  std::vector<int32_t> prefix_, suffix_;  // forced tokens
  std::vector<std::string> targets_;      // `<name>", "arguments": ` per name (JSON-escaped)
  std::vector<std::shared_ptr<const JsonSchema>> target_schemas_;  // [targets_] null: any object
  int32_t eos_ = -1;
  Phase phase_ = Phase::kPrefix;
  size_t forced_pos_ = 0;
  std::string name_;  // kName: the bytes so far
  JsonObjectPrefix json_;                     // kArgs without a schema
  std::shared_ptr<const JsonSchema> schema_;  // kArgs with one
  JsonSchemaPrefix doc_;
  // Scratch of allowed_tokens() with a schema: the machine after each trie depth, and each
  // token's shortest completion (-1: refused).
  mutable std::vector<JsonSchemaPrefix> levels_;
  mutable std::vector<int64_t> cost_;
};

}  // namespace oscar::engine
