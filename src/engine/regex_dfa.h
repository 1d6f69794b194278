// RegexDfa: JSON Schema `pattern`s (ECMA-262 regular expressions, read as with the `u` flag: the
// text is a sequence of code points) compiled into one deterministic automaton over the UTF-8
// bytes of a string, accepting the strings that every pattern given matches. engine/json_schema.h
// steps it beside its JSON-string state. Not here: JSON escapes, length bounds, tokens.
//
// Semantics are regex_search's: a pattern matches anywhere unless anchored, so an unanchored P
// is the language [^]*P[^]*; `^` may open and `$` close each top-level alternative.
// Supported: literals (any code point), `.` (all but \n \r \u2028 \u2029), escapes (\d \D \w \W
// \s \S, \t \n \v \f \r \0, \xHH, \uHHHH with surrogate pairs, \u{H..}, \cX, and \ before any
// punctuation), classes with ranges and negation (`[^...]`, the escapes above inside, `[\b]`),
// groups `(...)`, `(?:...)` and `(?<name>...)` (all plain grouping: nothing is captured),
// alternation, the quantifiers * + ? {n} {n,} {n,m} (a lazy `?` after one is the same language)
// and lookahead `(?=X)` / `(?!X)` only right after the leading `^` of a pattern without
// top-level `|` (then it constrains the whole string: zod's email pattern opens so).
// Refused, with the feature and its offset in the message: backreferences (\1, \k<name>),
// lookbehind, lookahead elsewhere, \b \B, \p{..} \P{..}, anchors anywhere else, unknown letter
// escapes (\A, \Z: not ECMAScript), counts above kMaxRepeat, and automata over kMaxStates.
//
// The automaton accepts valid UTF-8 only (no surrogates): a byte that can start no accepted
// string leads to the dead state 0. Immutable once built; shared freely across threads.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace oscar::engine {

class RegexDfa {
 public:
  static constexpr size_t kMaxStates = 4096;  // DFA states (the dead one included)
  static constexpr size_t kMaxNfaStates = 1 << 18;
  static constexpr int kMaxRepeat = 1000;  // n and m in {n,m}
  static constexpr int32_t kDead = 0;

  // The strings every pattern matches (an empty list: every string). Errors name the pattern
  // (by its index when there are several) and what is refused: "lookbehind '(?<=' (offset 3)".
  static Result<RegexDfa> compile(const std::vector<std::string>& patterns,
                                  size_t max_states = kMaxStates);

  int32_t start() const { return start_; }
  int32_t next(int32_t state, unsigned char byte) const {
    return next_[static_cast<size_t>(state) * n_classes_ + byte_class_[byte]];
  }
  bool accepting(int32_t s) const { return flags_[static_cast<size_t>(s)] & kAccepting; }
  // Accepting, and each whole character leads back to this state: every string is accepted from
  // here (an unanchored pattern after its match).
  bool universal(int32_t s) const { return flags_[static_cast<size_t>(s)] & kUniversal; }
  // UTF-8 continuation bytes still owed by the character being read (0 at a character boundary).
  int pending(int32_t s) const { return pending_[static_cast<size_t>(s)]; }
  size_t n_states() const { return pending_.size(); }

  // Bytes in one class step every state alike; the class count is small (tens).
  size_t n_classes() const { return n_classes_; }
  int byte_class(unsigned char byte) const { return byte_class_[byte]; }
  int32_t next_class(int32_t state, int cls) const {
    return next_[static_cast<size_t>(state) * n_classes_ + static_cast<size_t>(cls)];
  }

  // Whole-string match, for tests and callers that hold the text.
  bool matches(const std::string& text) const;

 private:
  static constexpr uint8_t kAccepting = 1, kUniversal = 2;
  friend struct DfaBuilder;
  std::array<uint8_t, 256> byte_class_{};
  size_t n_classes_ = 1;
  std::vector<int32_t> next_;  // [n_states * n_classes]
  std::vector<uint8_t> flags_;
  std::vector<uint8_t> pending_;
  int32_t start_ = kDead;
};

}  // namespace oscar::engine
