// Hugging Face tokenizer.json loader, byte-level BPE encoder and decoder (see tokenizer.h).
// Layout: JSON parsing helpers, added-token matching, pre-tokenizer steps (PCRE2), BPE with a
// per-word cache, then the public Tokenizer / StreamDecoder methods.
#include "tokenizer/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <deque>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>
#include <unordered_map>

#include "core/check.h"
#include "core/mmap_file.h"
#include "core/utf8.h"
#include "tokenizer/byte_level.h"

namespace oscar::tok {
namespace {

using nlohmann::json;
namespace bl = byte_level;

// Hash map keyed by std::string that also accepts std::string_view lookups without a copy.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

// GPT-2's pre-tokenizer regex, used by ByteLevel(use_regex=true).
constexpr const char* kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// ---------------------------------------------------------------------------------------------
// Regex (PCRE2, UTF + UCP, JIT when available). Owns the compiled code; shareable across threads
// (match data is per call).

struct Regex {
  pcre2_code* code = nullptr;
  ~Regex() {
    if (code) pcre2_code_free(code);
  }
};

Result<std::shared_ptr<Regex>> compile_regex(const std::string& pattern, bool literal) {
  int err = 0;
  PCRE2_SIZE err_off = 0;
  uint32_t opts = PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK;
  if (literal) opts |= PCRE2_LITERAL;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   opts, &err, &err_off, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    return invalid_argument("pre-tokenizer regex '%s': %s at offset %zu", pattern.c_str(),
                            reinterpret_cast<const char*>(msg), static_cast<size_t>(err_off));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // failure (no JIT support) falls back silently
  auto re = std::make_shared<Regex>();
  re->code = code;
  return re;
}

// Per-call PCRE2 match data (one ovector pair is all we read).
struct MatchData {
  pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
  ~MatchData() { pcre2_match_data_free(md); }
};

// ---------------------------------------------------------------------------------------------
// Added tokens and their leftmost-longest matcher.

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;
  bool normalized = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
};

// One piece of text after splitting: either an added token (id >= 0) or text to tokenize.
struct Segment {
  std::string_view text;
  int32_t added_id = -1;
};

bool is_word_char(uint32_t cp) {
  if (cp == '_') return true;
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
         (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO);
}

// Byte ranges [first, second) of a text in which no added token may be recognised; sorted and
// disjoint (Tokenizer::encode(pieces)).
using LiteralRanges = std::vector<std::pair<size_t, size_t>>;

// True when [a, b) intersects one of `lit`.
bool overlaps_literal(const LiteralRanges* lit, size_t a, size_t b) {
  if (!lit || lit->empty()) return false;
  // The first range that ends after a.
  auto it = std::upper_bound(
      lit->begin(), lit->end(), a,
      [](size_t x, const std::pair<size_t, size_t>& r) { return x < r.second; });
  return it != lit->end() && it->first < b;
}

// Leftmost-longest matching of a set of added tokens in a text (what HF does with an
// Aho-Corasick automaton in LeftmostLongest mode). Candidates are bucketed by first byte and
// tried longest first; the token sets are small (tens), so this is fast on ordinary text.
class AddedMatcher {
 public:
  void add(const AddedToken* tok) {
    if (tok->content.empty()) return;
    auto& bucket = by_first_[static_cast<uint8_t>(tok->content[0])];
    bucket.push_back(tok);
    std::stable_sort(bucket.begin(), bucket.end(), [](const AddedToken* a, const AddedToken* b) {
      return a->content.size() > b->content.size();
    });
    any_ = true;
  }
  bool empty() const { return !any_; }

  // Splits `text` into segments, appending to `out`. A match that overlaps `literal` (byte ranges
  // of `text`) is not taken; scanning resumes one byte after its start.
  void split(std::string_view text, std::vector<Segment>& out,
             const LiteralRanges* literal = nullptr) const {
    if (!any_) {
      if (!text.empty()) out.push_back({text, -1});
      return;
    }
    size_t emitted = 0;  // text[emitted..) is not yet in `out`
    size_t pos = 0;
    while (pos < text.size()) {
      const auto& bucket = by_first_[static_cast<uint8_t>(text[pos])];
      const AddedToken* hit = nullptr;
      for (const AddedToken* t : bucket) {
        if (text.size() - pos >= t->content.size() &&
            std::memcmp(text.data() + pos, t->content.data(), t->content.size()) == 0) {
          hit = t;
          break;
        }
      }
      if (!hit) {
        ++pos;
        continue;
      }
      size_t start = pos, stop = pos + hit->content.size();
      if (overlaps_literal(literal, start, stop)) {
        ++pos;
        continue;
      }
      pos = stop;  // matches never overlap, even when rejected below
      if (hit->single_word) {
        const bool left_ok = start == 0 || !ends_with_word(text.substr(0, start));
        const bool right_ok = stop == text.size() || !starts_with_word(text.substr(stop));
        if (!left_ok || !right_ok) continue;
      }
      if (hit->lstrip) {
        while (start > emitted) {
          size_t p = start - 1;
          while (p > emitted && (static_cast<uint8_t>(text[p]) & 0xC0) == 0x80) --p;
          size_t q = p;
          if (!bl::is_whitespace(utf8::next_codepoint(text, q))) break;
          start = p;
        }
      }
      if (hit->rstrip) {
        while (stop < text.size()) {
          size_t q = stop;
          if (!bl::is_whitespace(utf8::next_codepoint(text, q))) break;
          stop = q;
        }
        pos = stop;
      }
      if (start > emitted) out.push_back({text.substr(emitted, start - emitted), -1});
      out.push_back({text.substr(start, stop - start), hit->id});
      emitted = stop;
    }
    if (emitted < text.size()) out.push_back({text.substr(emitted), -1});
  }

 private:
  static bool ends_with_word(std::string_view s) {
    size_t p = s.size() - 1;
    while (p > 0 && (static_cast<uint8_t>(s[p]) & 0xC0) == 0x80) --p;
    return is_word_char(utf8::next_codepoint(s, p));
  }
  static bool starts_with_word(std::string_view s) {
    size_t p = 0;
    return is_word_char(utf8::next_codepoint(s, p));
  }

  std::array<std::vector<const AddedToken*>, 256> by_first_;
  bool any_ = false;
};

// ---------------------------------------------------------------------------------------------
// Pre-tokenizer steps.

struct PreTokStep {
  enum class Kind { kSplit, kByteLevel } kind = Kind::kSplit;
  std::shared_ptr<Regex> regex;  // Split: its pattern; ByteLevel: GPT-2 regex when use_regex
  bool remove_matches = false;   // Split behaviour "Removed" (else "Isolated")
  bool invert = false;           // Split: the pattern describes the gaps
  bool add_prefix_space = false; // ByteLevel
};

// BPE merge: rank (lower merges first) and the id of the merged token.
struct Merge {
  int32_t rank;
  int32_t id;
};

inline uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

}  // namespace

// ---------------------------------------------------------------------------------------------

struct TokenizerImpl {
  std::string path;                      // tokenizer.json, for messages
  StringMap vocab;                       // BPE token text -> id
  std::vector<std::string> id_to_token;  // [vocab_size] token text ("" for holes)
  std::vector<std::string> id_bytes;     // [vocab_size] decoded bytes of each id
  std::vector<uint8_t> id_kind;          // [vocab_size] 0 hole, 1 BPE, 2 added, 3 added special
  std::unordered_map<uint64_t, Merge> merges;  // (left id, right id) -> merge
  std::array<int32_t, 256> byte_id{};    // id of each single-byte token, -1 if absent

  std::deque<AddedToken> added;          // stable addresses for the matchers
  StringMap added_by_content;
  AddedMatcher raw_matcher;              // normalized == false: matched in the raw text
  AddedMatcher norm_matcher;             // normalized == true: matched after normalization

  bool nfc = false;
  std::vector<PreTokStep> pretok;

  std::string chat_template, eos_token, bos_token;

  // Per-word cache: piece bytes -> ids. Guarded by cache_mu; cleared when it reaches kCacheMax.
  static constexpr size_t kCacheMax = 1 << 17;
  static constexpr size_t kCacheMaxWordBytes = 128;
  mutable std::mutex cache_mu;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache;

  std::string normalize_segment(std::string_view s) const;
  void pretokenize(std::string_view s, std::vector<std::string_view>& pieces,
                   std::deque<std::string>& arena) const;
  void bpe(std::string_view piece, std::vector<int32_t>& out) const;
  void bpe_uncached(std::string_view piece, std::vector<int32_t>& out) const;
  // Added tokens split out, the rest normalized: the segments encode() tokenizes.
  // With `literal` (byte ranges of text), added tokens overlapping them are not split out, and
  // normalized added tokens are not matched in a run that overlaps them.
  void segments(std::string_view text, std::vector<Segment>& out, std::deque<std::string>& arena,
                const LiteralRanges* literal = nullptr) const;
  std::vector<int32_t> encode_segments(std::string_view text, const LiteralRanges* literal) const;
};

std::string TokenizerImpl::normalize_segment(std::string_view s) const {
  if (!nfc) return std::string(s);
  bool ascii = true;
  for (char c : s) {
    if (static_cast<uint8_t>(c) >= 0x80) {
      ascii = false;
      break;
    }
  }
  if (ascii) return std::string(s);
  utf8proc_uint8_t* dst = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                   static_cast<utf8proc_ssize_t>(s.size()), &dst,
                   static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  OSCAR_CHECK(n >= 0, "utf8proc NFC failed on validated UTF-8: %s",
              utf8proc_errmsg(static_cast<utf8proc_ssize_t>(n)));
  std::string out(reinterpret_cast<const char*>(dst), static_cast<size_t>(n));
  free(dst);
  return out;
}

void TokenizerImpl::segments(std::string_view text, std::vector<Segment>& out,
                             std::deque<std::string>& arena, const LiteralRanges* literal) const {
  std::vector<Segment> raw;
  raw_matcher.split(text, raw, literal);
  for (const Segment& seg : raw) {
    if (seg.added_id >= 0) {
      out.push_back(seg);
      continue;
    }
    std::string_view norm = seg.text;
    if (nfc) {
      std::string n = normalize_segment(seg.text);
      if (n != seg.text) norm = arena.emplace_back(std::move(n));
    }
    const size_t begin = static_cast<size_t>(seg.text.data() - text.data());
    if (overlaps_literal(literal, begin, begin + seg.text.size())) {
      if (!norm.empty()) out.push_back({norm, -1});
    } else {
      norm_matcher.split(norm, out);
    }
  }
}

std::vector<int32_t> TokenizerImpl::encode_segments(std::string_view text,
                                                    const LiteralRanges* literal) const {
  std::deque<std::string> arena;  // owns normalized text and prefixed pieces
  std::vector<Segment> segs;
  segments(text, segs, arena, literal);
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  std::vector<std::string_view> pieces;
  for (const Segment& seg : segs) {
    if (seg.added_id >= 0) {
      ids.push_back(seg.added_id);
      continue;
    }
    pretokenize(seg.text, pieces, arena);
    for (std::string_view p : pieces) bpe(p, ids);
  }
  return ids;
}

void TokenizerImpl::pretokenize(std::string_view s, std::vector<std::string_view>& pieces,
                                std::deque<std::string>& arena) const {
  pieces.clear();
  if (s.empty()) return;
  pieces.push_back(s);
  std::vector<std::string_view> next;
  MatchData md;
  for (const PreTokStep& step : pretok) {
    next.clear();
    for (std::string_view piece : pieces) {
      if (step.kind == PreTokStep::Kind::kByteLevel && step.add_prefix_space &&
          piece.front() != ' ') {
        std::string& prefixed = arena.emplace_back(1, ' ');
        prefixed.append(piece);
        piece = prefixed;
      }
      if (!step.regex) {
        next.push_back(piece);
        continue;
      }
      // Split `piece` into matches and gaps; emit per behaviour. Empty matches emit nothing.
      const bool keep_matches = step.kind == PreTokStep::Kind::kByteLevel ||
                                !(step.remove_matches && !step.invert);
      const bool keep_gaps = step.kind == PreTokStep::Kind::kByteLevel ||
                             !(step.remove_matches && step.invert);
      size_t off = 0, gap_start = 0;
      const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
      while (off <= piece.size()) {
        int rc = pcre2_match(step.regex->code, subject, piece.size(), off, PCRE2_NO_UTF_CHECK,
                             md.md, nullptr);
        if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) {
          // A JIT stack or match limit: retry with the interpreter. If that fails too, the rest
          // of the piece stays one pre-token (a different split, never a crash or lost text).
          rc = pcre2_match(step.regex->code, subject, piece.size(), off,
                           PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md.md, nullptr);
        }
        if (rc < 0) break;
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.md);
        const size_t ms = ov[0], me = ov[1];
        if (me == ms) {  // empty match: step one character forward
          if (ms >= piece.size()) break;
          size_t q = ms;
          utf8::next_codepoint(piece, q);
          off = q;
          continue;
        }
        if (ms > gap_start && keep_gaps) next.push_back(piece.substr(gap_start, ms - gap_start));
        if (keep_matches) next.push_back(piece.substr(ms, me - ms));
        gap_start = me;
        off = me;
      }
      if (gap_start < piece.size() && keep_gaps) next.push_back(piece.substr(gap_start));
    }
    pieces.swap(next);
  }
}

void TokenizerImpl::bpe_uncached(std::string_view piece, std::vector<int32_t>& out) const {
  // Symbols form a doubly linked list; candidate merges sit in a min-heap ordered by (rank,
  // position) and are re-validated when popped (HF's word.rs merge_all does the same).
  struct Sym {
    int32_t id, prev, next;
    bool alive;
  };
  struct Cand {
    int32_t rank, pos, id;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::vector<Sym> syms;
  syms.reserve(piece.size());
  for (char c : piece) {
    const int32_t id = byte_id[static_cast<uint8_t>(c)];
    if (id < 0) continue;  // no unk token: a byte without a token is dropped, as HF does
    const auto n = static_cast<int32_t>(syms.size());
    syms.push_back({id, n - 1, -1, true});
    if (n > 0) syms[n - 1].next = n;
  }
  if (syms.empty()) return;
  std::priority_queue<Cand, std::vector<Cand>, std::greater<>> heap;
  auto push_pair = [&](int32_t pos) {
    if (pos < 0 || syms[pos].next < 0) return;
    auto it = merges.find(pair_key(syms[pos].id, syms[syms[pos].next].id));
    if (it != merges.end()) heap.push({it->second.rank, pos, it->second.id});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(syms.size()); ++i) push_pair(i);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    Sym& left = syms[c.pos];
    if (!left.alive || left.next < 0) continue;
    auto it = merges.find(pair_key(left.id, syms[left.next].id));
    if (it == merges.end() || it->second.id != c.id) continue;  // stale candidate
    Sym& right = syms[left.next];
    left.id = c.id;
    right.alive = false;
    left.next = right.next;
    if (left.next >= 0) syms[left.next].prev = c.pos;
    push_pair(left.prev);
    push_pair(c.pos);
  }
  for (int32_t i = 0; i >= 0; i = syms[i].next) out.push_back(syms[i].id);
}

void TokenizerImpl::bpe(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.size() == 1) {
    const int32_t id = byte_id[static_cast<uint8_t>(piece[0])];
    if (id >= 0) out.push_back(id);
    return;
  }
  const bool cacheable = piece.size() <= kCacheMaxWordBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu);
    auto it = cache.find(piece);
    if (it != cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = out.size();
  bpe_uncached(piece, out);
  if (cacheable) {
    std::vector<int32_t> ids(out.begin() + static_cast<std::ptrdiff_t>(first), out.end());
    std::lock_guard<std::mutex> lock(cache_mu);
    if (cache.size() >= kCacheMax) cache.clear();
    cache.emplace(std::string(piece), std::move(ids));
  }
}

// ---------------------------------------------------------------------------------------------
// Loading.

namespace {

// Reads `key` of a JSON object as a string; absent/null -> "", {"content": s} -> s.
std::string token_name(const json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    auto c = it->find("content");
    if (c != it->end() && c->is_string()) return c->get<std::string>();
  }
  return "";
}

Status parse_normalizer(const json& j, TokenizerImpl& t, const std::string& where) {
  if (j.is_null()) return Status();
  const std::string type = j.value("type", std::string());
  if (type == "NFC") {
    t.nfc = true;
    return Status();
  }
  if (type == "Sequence") {
    for (const json& n : j.at("normalizers")) OSCAR_RETURN_IF_ERROR(parse_normalizer(n, t, where));
    return Status();
  }
  return unimplemented("%s: normalizer type '%s' is not supported (supported: NFC, Sequence, null)",
                       where.c_str(), type.c_str());
}

Status parse_pretokenizer(const json& j, TokenizerImpl& t, const std::string& where) {
  const std::string type = j.value("type", std::string());
  if (type == "Sequence") {
    for (const json& p : j.at("pretokenizers")) OSCAR_RETURN_IF_ERROR(parse_pretokenizer(p, t, where));
    return Status();
  }
  PreTokStep step;
  if (type == "Split") {
    const json& pat = j.at("pattern");
    bool literal;
    std::string pattern;
    if (pat.contains("Regex")) {
      pattern = pat.at("Regex").get<std::string>();
      literal = false;
    } else if (pat.contains("String")) {
      pattern = pat.at("String").get<std::string>();
      literal = true;
    } else {
      return invalid_argument("%s: Split pattern has neither 'Regex' nor 'String'", where.c_str());
    }
    const std::string behavior = j.value("behavior", std::string());
    if (behavior == "Removed") {
      step.remove_matches = true;
    } else if (behavior != "Isolated") {
      return unimplemented("%s: Split behavior '%s' is not supported (supported: Isolated, Removed)",
                           where.c_str(), behavior.c_str());
    }
    step.invert = j.value("invert", false);
    auto re = compile_regex(pattern, literal);
    if (!re.ok()) return re.status().with_context(where);
    step.regex = std::move(re).value();
  } else if (type == "ByteLevel") {
    step.kind = PreTokStep::Kind::kByteLevel;
    step.add_prefix_space = j.value("add_prefix_space", false);
    if (j.value("use_regex", true)) {
      OSCAR_ASSIGN_OR_RETURN(step.regex, compile_regex(kGpt2Regex, false));
    }
  } else {
    return unimplemented(
        "%s: pre_tokenizer type '%s' is not supported (supported: Sequence, Split, ByteLevel)",
        where.c_str(), type.c_str());
  }
  t.pretok.push_back(std::move(step));
  return Status();
}

// The 151k-entry model.vocab object and model.merges array dominate a Qwen tokenizer.json. A
// DOM would hold them in std::map / json nodes and then be copied again, so they are captured
// straight from the SAX stream into flat vectors; every other value goes to a normal DOM, where
// vocab and merges appear as null. This keeps loading the 7 MB Qwen3 file well under a second.
class CaptureSax {
 public:
  using dom_parser = nlohmann::detail::json_sax_dom_parser<json>;

  explicit CaptureSax(json& root) : dom_(root, /*allow_exceptions=*/false) {}

  std::vector<std::pair<std::string, int64_t>> vocab;  // in file order
  std::vector<std::pair<std::string, std::string>> merges;  // "a b" strings already split
  bool have_vocab = false, have_merges = false;
  std::string error;  // first structural problem inside vocab/merges
  std::string parse_error_msg;

  bool null() { return mode_ == Mode::kDom ? dom_.null() : bad_value("null"); }
  bool boolean(bool v) { return mode_ == Mode::kDom ? dom_.boolean(v) : bad_value("a boolean"); }
  bool number_integer(json::number_integer_t v) {
    return mode_ == Mode::kDom ? dom_.number_integer(v) : vocab_id(v);
  }
  bool number_unsigned(json::number_unsigned_t v) {
    if (mode_ == Mode::kDom) return dom_.number_unsigned(v);
    return vocab_id(v > static_cast<json::number_unsigned_t>(INT64_MAX) ? -1
                                                                        : static_cast<int64_t>(v));
  }
  bool number_float(json::number_float_t v, const std::string& str) {
    return mode_ == Mode::kDom ? dom_.number_float(v, str) : bad_value("a float");
  }
  bool string(std::string& v) {
    switch (mode_) {
      case Mode::kDom: return dom_.string(v);
      case Mode::kMerges: {
        const size_t sp = v.find(' ');
        if (sp == std::string::npos || v.find(' ', sp + 1) != std::string::npos) {
          return fail(oscar::str_format("merge %zu '%s' is not two tokens separated by one space",
                             merges.size(), v.c_str()));
        }
        merges.emplace_back(v.substr(0, sp), v.substr(sp + 1));
        return true;
      }
      case Mode::kMergePair:
        if (pair_n_ >= 2) return fail(oscar::str_format("merge %zu has more than two parts", merges.size()));
        (pair_n_ == 0 ? pair_.first : pair_.second) = std::move(v);
        ++pair_n_;
        return true;
      case Mode::kVocab: return bad_value("a string");
    }
    return false;
  }
  bool binary(json::binary_t& v) { return mode_ == Mode::kDom ? dom_.binary(v) : bad_value("binary"); }
  bool start_object(std::size_t n) {
    if (mode_ == Mode::kDom) {
      if (depth_ == 2 && in_model_ && key_ == "vocab") {
        mode_ = Mode::kVocab;
        have_vocab = true;
        if (n != static_cast<std::size_t>(-1)) vocab.reserve(n);
        return dom_.null();
      }
      ++depth_;
      if (depth_ == 2) in_model_ = key_ == "model";
      return dom_.start_object(n);
    }
    return bad_value("an object");
  }
  bool key(std::string& k) {
    if (mode_ == Mode::kVocab) {
      vocab_key_ = std::move(k);
      return true;
    }
    if (mode_ != Mode::kDom) return fail("unexpected key in merges");
    key_ = k;
    return dom_.key(k);
  }
  bool end_object() {
    if (mode_ == Mode::kVocab) {
      mode_ = Mode::kDom;
      return true;
    }
    if (mode_ != Mode::kDom) return fail("unexpected end of object");
    if (depth_ == 2) in_model_ = false;
    --depth_;
    return dom_.end_object();
  }
  bool start_array(std::size_t n) {
    switch (mode_) {
      case Mode::kDom:
        if (depth_ == 2 && in_model_ && key_ == "merges") {
          mode_ = Mode::kMerges;
          have_merges = true;
          return dom_.null();
        }
        ++depth_;
        return dom_.start_array(n);
      case Mode::kMerges:
        mode_ = Mode::kMergePair;
        pair_n_ = 0;
        return true;
      default: return bad_value("an array");
    }
  }
  bool end_array() {
    switch (mode_) {
      case Mode::kDom: --depth_; return dom_.end_array();
      case Mode::kMerges: mode_ = Mode::kDom; return true;
      case Mode::kMergePair:
        if (pair_n_ != 2) return fail(oscar::str_format("merge %zu is not a pair", merges.size()));
        merges.push_back(std::move(pair_));
        pair_ = {};
        mode_ = Mode::kMerges;
        return true;
      default: return fail("unexpected end of array");
    }
  }
  bool parse_error(std::size_t position, const std::string& last_token,
                   const nlohmann::detail::exception& ex) {
    parse_error_msg = oscar::str_format("byte %zu: %s", position, ex.what());
    return false;
  }

 private:
  enum class Mode { kDom, kVocab, kMerges, kMergePair };

  bool fail(std::string msg) {
    if (error.empty()) error = std::move(msg);
    return false;
  }
  bool bad_value(const char* what) {
    if (mode_ == Mode::kVocab) {
      return fail(oscar::str_format("vocab token '%s' has %s instead of an integer id", vocab_key_.c_str(), what));
    }
    return fail(oscar::str_format("merge %zu contains %s; expected \"a b\" or [\"a\", \"b\"]", merges.size(), what));
  }
  bool vocab_id(int64_t id) {
    if (mode_ != Mode::kVocab) return bad_value("a number");
    vocab.emplace_back(std::move(vocab_key_), id);
    return true;
  }

  dom_parser dom_;
  Mode mode_ = Mode::kDom;
  int depth_ = 0;          // DOM nesting depth: 1 inside the root object, 2 inside "model"
  bool in_model_ = false;  // the depth-2 object is the root's "model"
  std::string key_;        // last DOM key seen
  std::string vocab_key_;
  std::pair<std::string, std::string> pair_;
  int pair_n_ = 0;
};

Status parse_model(const json& m, CaptureSax& sax, TokenizerImpl& t, const std::string& where,
                   int32_t& max_id) {
  const std::string type = m.value("type", std::string());
  if (type != "BPE") {
    return unimplemented("%s: model type '%s' is not supported (only BPE)", where.c_str(),
                         type.c_str());
  }
  if (m.contains("dropout") && !m.at("dropout").is_null()) {
    return unimplemented("%s: BPE dropout is not supported", where.c_str());
  }
  if (m.value("byte_fallback", false)) {
    return unimplemented("%s: BPE byte_fallback is not supported", where.c_str());
  }
  if (!m.value("continuing_subword_prefix", json("")).is_null() &&
      !m.value("continuing_subword_prefix", std::string()).empty()) {
    return unimplemented("%s: BPE continuing_subword_prefix is not supported", where.c_str());
  }
  if (!m.value("end_of_word_suffix", json("")).is_null() &&
      !m.value("end_of_word_suffix", std::string()).empty()) {
    return unimplemented("%s: BPE end_of_word_suffix is not supported", where.c_str());
  }
  if (m.value("ignore_merges", false)) {
    return unimplemented("%s: BPE ignore_merges is not supported", where.c_str());
  }
  if (!sax.have_vocab) {
    return invalid_argument("%s: model.vocab is missing or not an object", where.c_str());
  }
  if (!sax.have_merges) {
    return invalid_argument("%s: model.merges is missing or not an array", where.c_str());
  }
  t.vocab.reserve(sax.vocab.size());
  for (auto& [token, id] : sax.vocab) {
    if (id < 0 || id > (1 << 30)) {
      return invalid_argument("%s: vocab token '%s' has id %lld out of range", where.c_str(),
                              token.c_str(), static_cast<long long>(id));
    }
    max_id = std::max(max_id, static_cast<int32_t>(id));
    t.vocab.emplace(std::move(token), static_cast<int32_t>(id));
  }
  t.merges.reserve(sax.merges.size());
  std::string joined;
  for (size_t rank = 0; rank < sax.merges.size(); ++rank) {
    const std::string& a = sax.merges[rank].first;
    const std::string& b = sax.merges[rank].second;
    joined.assign(a);
    joined.append(b);
    auto ia = t.vocab.find(a), ib = t.vocab.find(b), ij = t.vocab.find(std::string_view(joined));
    if (ia == t.vocab.end() || ib == t.vocab.end() || ij == t.vocab.end()) {
      return invalid_argument("%s: merge %zu ('%s' '%s'): %s not in the vocabulary",
                              where.c_str(), rank, a.c_str(), b.c_str(),
                              ij == t.vocab.end() && ia != t.vocab.end() && ib != t.vocab.end()
                                  ? "merged token"
                                  : "a part");
    }
    t.merges.insert_or_assign(pair_key(ia->second, ib->second),
                              Merge{static_cast<int32_t>(rank), ij->second});
  }
  return Status();
}

Status parse_decoder(const json& j, const std::string& where) {
  if (j.is_null()) return Status();
  const std::string type = j.value("type", std::string());
  if (type == "ByteLevel") return Status();
  return unimplemented("%s: decoder type '%s' is not supported (supported: ByteLevel, null)",
                       where.c_str(), type.c_str());
}

Status load_config(const std::filesystem::path& file, TokenizerImpl& t) {
  OSCAR_ASSIGN_OR_RETURN(std::string text, read_text_file(file.string()));
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return invalid_argument("%s: not a JSON object", file.string().c_str());
  }
  auto ct = j.find("chat_template");
  if (ct != j.end()) {
    if (ct->is_string()) {
      t.chat_template = ct->get<std::string>();
    } else if (ct->is_array()) {  // [{"name": ..., "template": ...}]: "default", else the first
      for (const json& e : *ct) {
        if (e.value("name", std::string()) == "default" || t.chat_template.empty()) {
          t.chat_template = e.value("template", std::string());
        }
      }
    }
  }
  t.eos_token = token_name(j, "eos_token");
  t.bos_token = token_name(j, "bos_token");
  return Status();
}

Result<std::unique_ptr<TokenizerImpl>> load_impl(const std::string& path_or_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path file = path_or_dir;
  if (fs::is_directory(file, ec)) file /= "tokenizer.json";
  if (!fs::exists(file, ec)) return not_found("tokenizer: %s does not exist", file.string().c_str());
  auto t = std::make_unique<TokenizerImpl>();
  t->path = file.string();
  const std::string& where = t->path;

  OSCAR_ASSIGN_OR_RETURN(std::string text, read_text_file(where));
  json j;
  CaptureSax sax(j);
  bool parsed = false;
  try {
    parsed = json::sax_parse(text, &sax);
  } catch (const json::exception& e) {
    return invalid_argument("%s: not valid JSON: %s", where.c_str(), e.what());
  }
  text = std::string();  // release the 7 MB buffer early
  if (!sax.error.empty()) return invalid_argument("%s: %s", where.c_str(), sax.error.c_str());
  if (!parsed) {
    return invalid_argument("%s: not valid JSON: %s", where.c_str(), sax.parse_error_msg.c_str());
  }
  if (!j.is_object()) return invalid_argument("%s: top level is not a JSON object", where.c_str());
  if (!j.contains("model") || !j.at("model").is_object()) {
    return invalid_argument("%s: missing 'model' object", where.c_str());
  }
  try {
    int32_t max_id = -1;
    OSCAR_RETURN_IF_ERROR(parse_model(j.at("model"), sax, *t, where, max_id));
    OSCAR_RETURN_IF_ERROR(parse_normalizer(j.value("normalizer", json()), *t, where));
    const json pt = j.value("pre_tokenizer", json());
    if (!pt.is_null()) OSCAR_RETURN_IF_ERROR(parse_pretokenizer(pt, *t, where));
    if (std::none_of(t->pretok.begin(), t->pretok.end(), [](const PreTokStep& s) {
          return s.kind == PreTokStep::Kind::kByteLevel;
        })) {
      return unimplemented("%s: no ByteLevel pre-tokenizer; only byte-level BPE is supported",
                           where.c_str());
    }
    OSCAR_RETURN_IF_ERROR(parse_decoder(j.value("decoder", json()), where));

    if (j.contains("added_tokens") && !j.at("added_tokens").is_null()) {
      for (const json& a : j.at("added_tokens")) {
        AddedToken tok;
        tok.content = a.at("content").get<std::string>();
        const int64_t id = a.at("id").get<int64_t>();
        if (id < 0 || id > (1 << 30)) {
          return invalid_argument("%s: added token '%s' has id %lld out of range", where.c_str(),
                                  tok.content.c_str(), static_cast<long long>(id));
        }
        tok.id = static_cast<int32_t>(id);
        tok.special = a.value("special", false);
        tok.normalized = a.value("normalized", !tok.special);
        tok.lstrip = a.value("lstrip", false);
        tok.rstrip = a.value("rstrip", false);
        tok.single_word = a.value("single_word", false);
        if (tok.content.empty()) {
          return invalid_argument("%s: added token %d has empty content", where.c_str(), tok.id);
        }
        max_id = std::max(max_id, tok.id);
        t->added.push_back(std::move(tok));
      }
    }

    // Id tables.
    const auto n = static_cast<size_t>(max_id + 1);
    t->id_to_token.assign(n, std::string());
    t->id_bytes.assign(n, std::string());
    t->id_kind.assign(n, 0);
    for (const auto& [token, id] : t->vocab) {
      t->id_to_token[id] = token;
      t->id_bytes[id] = bl::token_to_bytes(token);
      t->id_kind[id] = 1;
    }
    for (AddedToken& tok : t->added) {
      if (tok.normalized && t->nfc) tok.content = t->normalize_segment(tok.content);
      t->id_to_token[tok.id] = tok.content;
      t->id_bytes[tok.id] = tok.content;
      t->id_kind[tok.id] = tok.special ? 3 : 2;
      t->added_by_content.insert_or_assign(tok.content, tok.id);
      (tok.normalized ? t->norm_matcher : t->raw_matcher).add(&tok);
    }
    const auto& b2c = bl::byte_to_codepoint();
    for (int b = 0; b < 256; ++b) {
      std::string s;
      utf8::append(s, b2c[b]);
      auto it = t->vocab.find(std::string_view(s));
      t->byte_id[b] = it == t->vocab.end() ? -1 : it->second;
    }
  } catch (const json::exception& e) {
    return invalid_argument("%s: unexpected structure: %s", where.c_str(), e.what());
  }

  const fs::path config = file.parent_path() / "tokenizer_config.json";
  if (fs::exists(config, ec)) {
    try {
      OSCAR_RETURN_IF_ERROR(load_config(config, *t));
    } catch (const json::exception& e) {
      return invalid_argument("%s: unexpected structure: %s", config.string().c_str(), e.what());
    }
  }
  return t;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Public API.

Tokenizer::Tokenizer(std::unique_ptr<TokenizerImpl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Result<Tokenizer> Tokenizer::load(const std::string& path_or_dir) {
  OSCAR_ASSIGN_OR_RETURN(auto impl, load_impl(path_or_dir));
  return Tokenizer(std::move(impl));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::string repaired;
  if (!utf8::valid(text)) {
    repaired = utf8::repair(text);
    text = repaired;
  }
  return impl_->encode_segments(text, nullptr);
}

std::vector<int32_t> Tokenizer::encode(std::span<const TextPiece> pieces) const {
  std::string text;
  LiteralRanges literal;
  for (const TextPiece& p : pieces) {
    const size_t begin = text.size();
    if (utf8::valid(p.text)) {
      text.append(p.text);
    } else {
      text += utf8::repair(p.text);
    }
    if (p.literal && text.size() > begin) {
      if (!literal.empty() && literal.back().second == begin) {
        literal.back().second = text.size();
      } else {
        literal.emplace_back(begin, text.size());
      }
    }
  }
  return impl_->encode_segments(text, &literal);
}

std::vector<std::string> Tokenizer::added_tokens() const {
  std::vector<const AddedToken*> sorted;
  for (const AddedToken& t : impl_->added) sorted.push_back(&t);
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const AddedToken* a, const AddedToken* b) { return a->id < b->id; });
  std::vector<std::string> out;
  for (const AddedToken* t : sorted) out.push_back(t->content);
  return out;
}

std::string Tokenizer::normalize(std::string_view text) const {
  std::string repaired;
  if (!utf8::valid(text)) {
    repaired = utf8::repair(text);
    text = repaired;
  }
  std::deque<std::string> arena;
  std::vector<Segment> segs;
  impl_->segments(text, segs, arena);
  std::string out;
  for (const Segment& seg : segs) {
    out.append(seg.added_id >= 0 ? std::string_view(impl_->id_bytes[seg.added_id]) : seg.text);
  }
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string bytes;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size()) continue;
    const uint8_t kind = impl_->id_kind[id];
    if (kind == 0 || (skip_special && kind == 3)) continue;
    bytes += impl_->id_bytes[id];
  }
  return utf8::valid(bytes) ? bytes : utf8::repair(bytes);
}

Status Tokenizer::validate_ids(std::span<const int32_t> ids) const {
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (id < 0 || id >= vocab_size() || impl_->id_kind[id] == 0) {
      return out_of_range("token id %d at index %zu is not in the vocabulary (vocab_size %d)", id,
                          i, vocab_size());
    }
  }
  return Status();
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->id_kind.size()); }

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  auto a = impl_->added_by_content.find(token);
  if (a != impl_->added_by_content.end()) return a->second;
  auto v = impl_->vocab.find(token);
  if (v != impl_->vocab.end()) return v->second;
  return std::nullopt;
}

std::string Tokenizer::id_to_token(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return std::string();
  return impl_->id_to_token[id];
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < vocab_size() && impl_->id_kind[id] == 3;
}

bool Tokenizer::is_added(int32_t id) const {
  return id >= 0 && id < vocab_size() && impl_->id_kind[id] >= 2;
}

const std::string& Tokenizer::chat_template() const { return impl_->chat_template; }
const std::string& Tokenizer::eos_token() const { return impl_->eos_token; }
const std::string& Tokenizer::bos_token() const { return impl_->bos_token; }

std::optional<int32_t> Tokenizer::eos_token_id() const {
  if (impl_->eos_token.empty()) return std::nullopt;
  return token_to_id(impl_->eos_token);
}

std::optional<int32_t> Tokenizer::bos_token_id() const {
  if (impl_->bos_token.empty()) return std::nullopt;
  return token_to_id(impl_->bos_token);
}

std::string_view Tokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return impl_->id_bytes[id];
}

std::string StreamDecoder::push(int32_t id) {
  if (skip_special_ && tokenizer_->is_special(id)) return std::string();
  pending_ += tokenizer_->token_bytes(id);
  const size_t keep = utf8::incomplete_suffix(pending_);
  const std::string_view ready = std::string_view(pending_).substr(0, pending_.size() - keep);
  std::string out = utf8::valid(ready) ? std::string(ready) : utf8::repair(ready);
  pending_.erase(0, pending_.size() - keep);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out = utf8::repair(pending_);
  pending_.clear();
  return out;
}

}  // namespace oscar::tok
