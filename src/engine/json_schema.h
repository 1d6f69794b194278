// Structured outputs: a JSON Schema compiled into a graph of nodes (JsonSchema), and the character
// machine that says whether a byte string is a prefix of a document valid under it
// (JsonSchemaPrefix). engine/tool_constraint.h lifts the machine to tokens (response_format
// json_schema, strict tool calls). Not here: tokens, the vocabulary, the budget rule.
//
// Supported (OpenAI's strict-mode subset): type (object, array, string, number, integer, boolean,
// null, or a list of them), properties, required, additionalProperties, items, minItems,
// maxItems, enum, const, anyOf, $ref to any JSON pointer in the schema ("#", "#/$defs/X",
// "#/definitions/X"; recursion included), minimum, maximum, exclusiveMinimum, exclusiveMaximum,
// minLength, maxLength, pattern and format on strings (below). Ignored annotations: title,
// description, $schema, $id, $comment, examples, default, deprecated, readOnly, writeOnly
// ($defs / definitions are read through $ref), and formats other than those listed below (as
// OpenAI and vLLM treat them: annotations). Anything else (oneOf, allOf, not, multipleOf,
// prefixItems, uniqueItems, minProperties, patternProperties, ...) fails compile() with a message
// naming the keyword and where it is. A schema is compiled the same with "strict" true or false
// (strict's rules, every property required and additionalProperties false, are not demanded; the
// output follows the schema either way).
//
// pattern: an ECMA-262 regex over the decoded string, unanchored unless ^ / $ say so (the subset
// engine/regex_dfa.h compiles; an unsupported feature fails compile() naming it, its offset and
// the JSON pointer: "'pattern' (at #/properties/a): lookbehind '(?<=' is not supported (offset
// 0)"). format: date, time and date-time (RFC 3339, with Z or an offset; T and Z upper case),
// uuid, email (dot-atom local part, a domain of two or more labels), ipv4, ipv6 (without the
// IPv4-suffix and zone forms), hostname (labels of at most 63, no total limit), uri (a scheme and
// RFC 3986 characters) become built-in patterns; with a pattern too, the string matches both.
// Limits: RegexDfa::kMaxStates automaton states per string (pattern and format together), and
// kMaxPatternCells for all the schema's cost tables (automaton states x (maxLength + 1), or
// x (minLength + 1) without maxLength); beyond them compile() fails saying so.
//
// What the machine generates, a subset of the valid documents, chosen to be compact:
//   - whitespace: at most kMaxWhitespace spaces in a row between tokens, no newlines, none
//     before the top-level value or inside numbers;
//   - objects with properties: the properties in their declared order, each required one
//     present, optional ones present or skipped, no others (additionalProperties is then only
//     checked for being false, true or a schema). An object schema without properties is a map:
//     any keys, each value following additionalProperties (absent or true: any JSON value;
//     false: only `{}`);
//   - numbers: no exponent, at most kNumberIntDigits integer and kNumberFracDigits fraction
//     digits (integers: at most kIntegerDigits digits, no fraction); minimum / maximum /
//     exclusive bounds are enforced exactly on that decimal grid while the digits are written
//     (a digit is refused when no completion of the number is within the bounds);
//   - enum / const values: their compact JSON text (nlohmann's dump), byte for byte;
//   - strings: any valid JSON string (escapes, UTF-8; no lone surrogate escapes), minLength /
//     maxLength counted in code points. Under a pattern or format the automaton sees each decoded
//     character: raw UTF-8 is written as such, and of the escapes only \" \\ \/ \b \f \n \r \t
//     (no \u: a character the pattern allows is written raw, and the other control characters
//     are never written); a byte is taken only where the pattern and the lengths can still be
//     met (no dead ends), and min_completion() counts the fewest bytes to get there exactly;
//   - nesting: at most kMaxDepth open values; an optional property, an array item or a map
//     entry is refused where its shortest value would not fit.
// A schema that admits no finite document (a required property that recurses without end,
// minimum > maximum) fails compile().
//
// Thread-safety: a compiled JsonSchema is immutable and shared (shared_ptr<const>); a
// JsonSchemaPrefix is a value used by one thread.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "engine/regex_dfa.h"

namespace oscar::engine {

class JsonSchema {
 public:
  static constexpr int kMaxDepth = 32;
  static constexpr int kMaxWhitespace = 1;
  static constexpr int kNumberIntDigits = 12;
  static constexpr int kNumberFracDigits = 6;
  static constexpr int kIntegerDigits = 15;
  static constexpr size_t kMaxNodes = 4096;
  static constexpr int64_t kInfinite = int64_t{1} << 50;  // "no finite document" in min_bytes
  // Cells of every string pattern's cost table and automaton, together (int32 each).
  static constexpr size_t kMaxPatternCells = size_t{1} << 22;

  // The schema (ordered: properties keep their declared order). Errors name the keyword and its
  // JSON pointer: "'multipleOf' (at #/properties/n) is not supported".
  static Result<std::shared_ptr<const JsonSchema>> compile(const nlohmann::ordered_json& schema);

  enum class Kind : uint8_t { kObject, kMap, kArray, kString, kNumber, kEnum, kAnyOf };
  struct Prop {
    std::string quoted;  // the key as written: JSON-escaped, with its quotes
    int32_t node = -1;
    bool required = false;
  };
  struct Node {
    Kind kind = Kind::kAnyOf;
    std::vector<Prop> props;  // kObject, declared order
    // kObject, per i in [0, props.size()]: the first required property at or after i
    // (props.size() if none), the required ones from i and their bytes (key, ':', value).
    std::vector<int32_t> first_required;
    std::vector<int32_t> n_required;
    std::vector<int64_t> required_bytes;
    int32_t items = -1;                            // kArray: the items; kMap: the values
    int64_t min_count = 0, max_count = INT64_MAX;  // kArray items, kString code points
    bool integer = false;                          // kNumber
    int64_t lo = 0, hi = 0;  // kNumber bounds, in units of 10^-scale (scale 0 for integers)
    std::vector<std::string> literals;  // kEnum: compact JSON texts, sorted
    std::vector<int32_t> options;       // kAnyOf
    int64_t min_bytes = kInfinite;      // the shortest valid document
    int32_t min_depth = 0;              // its nesting (open values), this one included
    int32_t pattern = -1;               // kString: its StringPattern (pattern / format), or -1
  };

  // A string's pattern (and format) automaton, with the fewest JSON bytes that finish the
  // string's content from each automaton state, given the code points written so far and the
  // node's minLength / maxLength. The table's column is max_count - code points when maxLength
  // is set (then any count in [min_count, max_count] may end it), else
  // max(0, min_count - code points) (at least that many more).
  struct StringPattern {
    static constexpr int32_t kNone = INT32_MAX;  // no finish
    std::shared_ptr<const RegexDfa> dfa;
    int64_t min_count = 0, max_count = INT64_MAX;
    int64_t columns = 1;
    std::vector<int32_t> cost;  // [dfa->n_states(), columns], excluding the closing quote
    int32_t rest(int32_t state, int64_t code_points) const {
      const int64_t col = max_count != INT64_MAX ? max_count - code_points
                                                 : std::max<int64_t>(0, min_count - code_points);
      if (state == RegexDfa::kDead || col < 0 || col >= columns) return kNone;
      return cost[static_cast<size_t>(state) * static_cast<size_t>(columns) +
                  static_cast<size_t>(col)];
    }
  };
  const StringPattern& pattern(int32_t i) const { return patterns_[static_cast<size_t>(i)]; }

  const Node& node(int32_t i) const { return nodes_[static_cast<size_t>(i)]; }
  int32_t root() const { return root_; }
  int32_t key_node() const { return key_node_; }  // a plain string: map keys
  bool root_is_object() const;
  size_t n_nodes() const { return nodes_.size(); }

 private:
  friend struct SchemaCompiler;
  std::vector<Node> nodes_;
  std::vector<StringPattern> patterns_;
  int32_t root_ = -1;
  int32_t key_node_ = -1;
};

// Whether a byte string is a prefix of a document valid under a JsonSchema (a copyable value:
// probing a token is copy, feed its bytes). Where the schema leaves a choice open (anyOf, a
// property that may be skipped) the machine follows every alternative at once, up to
// kMaxAlternatives (more are dropped: the output stays valid, fewer documents are reachable).
class JsonSchemaPrefix {
 public:
  static constexpr size_t kMaxAlternatives = 64;

  // schema must outlive the machine.
  explicit JsonSchemaPrefix(const JsonSchema* schema);
  JsonSchemaPrefix() = default;

  // False: the byte makes the text no prefix of a valid document (the state is then unchanged).
  bool feed(unsigned char c);
  // *out = this machine after c (out's buffers are reused; out != this). False: c is refused
  // (*out is then unspecified).
  bool feed_into(unsigned char c, JsonSchemaPrefix* out) const;
  // No byte may follow: every alternative has closed its top-level value.
  bool complete() const;
  // The text is a whole valid document (complete(), or a top-level number that may go on).
  bool can_end() const;
  // The fewest bytes that make the text a whole valid document (0 when can_end()); each is
  // ASCII or a UTF-8 continuation byte (or any UTF-8 byte where a pattern demands a non-ASCII
  // character), and feeding the first leaves min_completion() - 1.
  int64_t min_completion() const;
  // One alternative, inside a string without maxLength that has reached its minLength, not in an
  // escape or a UTF-8 character (under a pattern: in a universal automaton state, as after an
  // unanchored pattern's match): any further plain character leaves the state as it is (but for
  // the count) and min_completion() unchanged.
  bool in_free_string() const;

  struct Frame {
    uint8_t kind = 0;
    uint8_t phase = 0;
    uint8_t ws = 0;  // spaces in a row
    uint8_t x = 0;   // string: hex digits / UTF-8 bytes pending; number: negative
    int32_t node = -1;
    int32_t a = 0;  // object: next property; array: items done; enum: first candidate; number:
                    // integer digits; string under a pattern: the RegexDfa state
    int32_t b = 0;  // object: the current property; enum: end of candidates; number: fraction
                    // digits; string: UTF-8 range or surrogate flag
    int64_t v = 0;  // object: key bytes matched; enum: bytes matched; number: the digits' value;
                    // string: code points
    bool operator==(const Frame&) const = default;
  };

 private:
  const JsonSchema* schema_ = nullptr;
  std::vector<Frame> frames_;      // the alternatives' stacks, one after the other
  std::vector<uint32_t> alt_end_;  // [n_alternatives] end of each in frames_
  friend struct PrefixStepper;
};

}  // namespace oscar::engine
