// Byte-level BPE tokenizer built from a Hugging Face tokenizer.json (Qwen2/Qwen3 family, GPT-2 style).
// It reproduces HF `tokenizers` encode(text, add_special_tokens=false) and decode() exactly for the
// pipeline these files use:
//   1. added tokens (special or not) are split out first, leftmost-longest, as HF's added vocabulary
//      does: `normalized: false` ones in the raw text, `normalized: true` ones in the normalized text;
//      `lstrip`, `rstrip` and `single_word` are honoured;
//   2. normalizer: NFC (utf8proc) or none;
//   3. pre-tokenizer: Sequence / Split (regex or literal, PCRE2 with UTF+UCP, JIT when available;
//      behaviours Isolated and Removed) / ByteLevel (with or without the GPT-2 regex);
//   4. BPE with rank-ordered merges (stored as ["a","b"] pairs or "a b" strings), no unk, no byte
//      fallback, no dropout;
//   5. decoder ByteLevel: ids -> bytes, invalid UTF-8 replaced by U+FFFD (maximal subparts).
// Anything else in a tokenizer.json (another model type, normalizer, pre-tokenizer or decoder) is
// refused at load() with a Status naming it. Post-processors are ignored: encode() never adds
// BOS/EOS (Qwen behaviour); callers add special tokens explicitly.
// Not here: chat templates (tokenizer/chat_template.h), batching, offsets, truncation, padding.
//
// Thread-safety: a loaded Tokenizer is immutable except for its per-word BPE cache, which is guarded
// by a mutex; encode()/decode() may be called concurrently from several threads. StreamDecoder is
// single-threaded (one per generated sequence).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace oscar::tok {

struct TokenizerImpl;  // tokenizer.cpp: vocabulary, merges, compiled regexes, cache

class Tokenizer {
 public:
  // `path_or_dir` is a tokenizer.json file or a directory holding one. tokenizer_config.json next to
  // it is read when present (chat template, eos/bos names); its absence is not an error.
  static Result<Tokenizer> load(const std::string& path_or_dir);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;
  ~Tokenizer();

  // Text -> ids, no special tokens added; special tokens written in the text are recognised.
  // Invalid UTF-8 in `text` is first replaced by U+FFFD (one per maximal invalid subpart), as a
  // client decoding bytes with errors="replace" would do.
  std::vector<int32_t> encode(std::string_view text) const;

  // One piece of a text assembled from trusted and untrusted parts (tokenizer/chat_prompt.h).
  struct TextPiece {
    std::string_view text;
    bool literal = false;  // true: no added token is recognised in it (ordinary text)
  };
  // encode() of the concatenated pieces, except that an added token is recognised only where it
  // lies wholly outside the literal pieces: "<|im_end|>" inside a literal piece becomes the ids of
  // that text (as HF's split_special_tokens=True would give), tokenized together with its
  // neighbours as one ordinary text. Each piece is UTF-8-repaired on its own. Added tokens marked
  // `normalized: true` are not recognised in a text run that touches a literal piece (Qwen's
  // added tokens are all `normalized: false`).
  std::vector<int32_t> encode(std::span<const TextPiece> pieces) const;

  // The text of every added token (special or not), in id order.
  std::vector<std::string> added_tokens() const;

  // Ids -> UTF-8 text. Added tokens decode to their content; `skip_special` drops tokens marked
  // special. Ids that name no token (negative, >= vocab_size(), or a hole in the id range) are
  // skipped, as HF does; call validate_ids() first where such ids must be rejected instead.
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;

  // OK when every id names a token; otherwise OutOfRange naming the first bad id and its index.
  Status validate_ids(std::span<const int32_t> ids) const;

  // The text that decode(encode(text)) reproduces: added tokens verbatim, the rest normalized.
  // Equals NFC(text) except where a combining mark follows an added token (e.g. "<|im_end|>" +
  // U+0338 would compose with '>' under whole-text NFC).
  std::string normalize(std::string_view text) const;

  int32_t vocab_size() const;  // max id + 1, added tokens included
  std::optional<int32_t> token_to_id(std::string_view token) const;  // added tokens first
  std::string id_to_token(int32_t id) const;  // byte-level form ("Ġhello"); "" for unknown ids
  bool is_special(int32_t id) const;          // an added token with `special: true`
  bool is_added(int32_t id) const;            // any added token

  // From tokenizer_config.json (empty / nullopt when absent).
  const std::string& chat_template() const;
  const std::string& eos_token() const;
  const std::string& bos_token() const;
  std::optional<int32_t> eos_token_id() const;
  std::optional<int32_t> bos_token_id() const;

  // Bytes a single id decodes to (no UTF-8 repair); empty for unknown ids. Used by StreamDecoder.
  std::string_view token_bytes(int32_t id) const;

 private:
  explicit Tokenizer(std::unique_ptr<TokenizerImpl> impl);
  std::unique_ptr<TokenizerImpl> impl_;
};

// Incremental decoding for generation: push one id at a time and get back only complete UTF-8.
// A multi-byte character split across tokens is held back until its last byte arrives; bytes that
// can never complete a character become U+FFFD immediately. The concatenation of every push() and
// the final flush() equals Tokenizer::decode() of the same ids. Holds a reference to the tokenizer,
// which must outlive it. Not thread-safe.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special = false)
      : tokenizer_(&tokenizer), skip_special_(skip_special) {}

  std::string push(int32_t id);
  // Emits what is still held back (an incomplete character becomes U+FFFD) and resets.
  std::string flush();
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_;
  std::string pending_;  // bytes not yet emitted: at most a 3-byte incomplete UTF-8 prefix
};

}  // namespace oscar::tok
