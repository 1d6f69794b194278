#include "eval/merge.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

namespace oscar::eval {

namespace {

using nlohmann::json;

// Parses one mode object of a report (see report_json in report.cpp for the layout).
ModeReport parse_mode(const json& mj) {
  ModeReport m;
  m.mode = mj.at("mode").get<std::string>();
  m.supported = mj.at("supported").get<bool>();
  m.seconds = mj.value("seconds", 0.0);
  m.error = mj.value("error", std::string());
  m.describe = mj.value("runtime", std::string());
  if (mj.contains("ppl")) {
    const json& p = mj.at("ppl");
    PplResult r;
    r.n_windows = p.at("n_windows").get<int>();
    r.n_predictions = p.at("n_predictions").get<int64_t>();
    r.n_tail = p.at("n_tail").get<int64_t>();
    r.nll_sum = p.at("mean_nll").get<double>() * static_cast<double>(r.n_predictions);
    const double tail = p.at("ppl_tail").get<double>();
    r.nll_tail_sum = tail > 0 ? std::log(tail) * static_cast<double>(r.n_tail) : 0.0;
    r.window_nll = p.at("window_mean_nll").get<std::vector<double>>();
    r.seconds = p.value("seconds", 0.0);
    m.ppl = std::move(r);
  }
  if (mj.contains("fidelity")) {
    const json& f = mj.at("fidelity");
    FidelityResult r;
    r.score_kl = f.at("score_kl_per_layer").get<std::vector<double>>();
    r.out_err = f.at("out_rel_err_per_layer").get<std::vector<double>>();
    r.hidden_err = f.at("hidden_rel_err").get<double>();
    r.logit_kl = f.at("logit_kl").get<double>();
    r.score_check_max_err = f.value("score_check_max_rel_err", 0.0);
    r.n_windows = f.at("n_windows").get<int>();
    r.seconds = f.value("seconds", 0.0);
    m.fidelity = std::move(r);
  }
  if (mj.contains("niah")) {
    NiahResult r;
    for (const json& l : mj.at("niah").at("per_length")) {
      NiahLengthResult x;
      x.target_len = l.at("target_len").get<int>();
      x.n = l.at("n").get<int>();
      x.correct = l.at("correct").get<int>();
      x.token_count_mismatches = l.value("token_count_mismatches", 0);
      r.per_length.push_back(x);
    }
    r.seconds = mj.at("niah").value("seconds", 0.0);
    m.niah = std::move(r);
  }
  if (mj.contains("bits")) {
    const json& b = mj.at("bits");
    CacheBits c;
    c.n_tokens = b.at("measured_after_prefill_tokens").get<int64_t>();
    c.hist_tokens = b.at("hist_tokens").get<int64_t>();
    c.bytes.sink = b.at("bytes_sink").get<int64_t>();
    c.bytes.history = b.at("bytes_history").get<int64_t>();
    c.bytes.recent = b.at("bytes_recent").get<int64_t>();
    c.elems_per_token = b.at("elements_per_token").get<int64_t>();
    c.bits_hist = b.at("bits_hist").get<double>();
    c.bits_total = b.at("bits_total_measured").get<double>();
    m.bits = c;
  }
  return m;
}

void merge_into(ModeReport& into, const ModeReport& m) {
  into.seconds += m.seconds;
  if (into.describe.empty()) into.describe = m.describe;
  if (m.ppl) {
    if (!into.ppl) {
      into.ppl = m.ppl;
    } else {
      PplResult& p = *into.ppl;
      p.n_windows += m.ppl->n_windows;
      p.n_predictions += m.ppl->n_predictions;
      p.n_tail += m.ppl->n_tail;
      p.nll_sum += m.ppl->nll_sum;
      p.nll_tail_sum += m.ppl->nll_tail_sum;
      p.window_nll.insert(p.window_nll.end(), m.ppl->window_nll.begin(), m.ppl->window_nll.end());
      p.seconds += m.ppl->seconds;
    }
  }
  if (m.fidelity && !into.fidelity) into.fidelity = m.fidelity;
  if (m.niah) {
    if (!into.niah) into.niah = NiahResult();
    into.niah->seconds += m.niah->seconds;
    for (const NiahLengthResult& l : m.niah->per_length) {
      auto it = std::find_if(into.niah->per_length.begin(), into.niah->per_length.end(),
                             [&](const NiahLengthResult& x) { return x.target_len == l.target_len; });
      if (it == into.niah->per_length.end()) {
        into.niah->per_length.push_back(l);
      } else {
        it->n += l.n;
        it->correct += l.correct;
        it->token_count_mismatches += l.token_count_mismatches;
      }
    }
  }
  if (m.bits && (!into.bits || m.bits->n_tokens > into.bits->n_tokens)) into.bits = m.bits;
}

}  // namespace

Result<EvalReport> read_report_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return invalid_argument("eval report %s: cannot open", path.c_str());
  try {
    const json j = json::parse(in);
    EvalReport r;
    r.info.command_line = j.value("command_line", std::string());
    r.info.date = j.value("date", std::string());
    r.info.machine = j.value("machine", std::string());
    r.info.git_commit = j.value("git_commit", std::string());
    const json& c = j.at("config");
    EvalConfig& cfg = r.config;
    cfg.runtime.model_dir = c.at("model").get<std::string>();
    cfg.modes = c.at("modes").get<std::vector<std::string>>();
    cfg.runtime.n_sink = c.at("n_sink").get<int>();
    cfg.runtime.n_recent = c.at("n_recent").get<int>();
    cfg.runtime.page_size = c.at("page_size").get<int>();
    cfg.runtime.group_size = c.at("group_size").get<int>();
    cfg.runtime.k_clip = c.value("k_clip_override", -1.f);
    cfg.runtime.v_clip = c.value("v_clip_override", -1.f);
    cfg.runtime.kv_bits = c.value("kv_bits", 0.0);
    cfg.runtime.rotations = c.value("rotations", std::string());
    cfg.dev_text = c.value("dev_text", std::string());
    cfg.niah_file = c.value("niah_file", std::string());
    cfg.ppl.n_windows = c.at("ppl_windows").get<int>();
    cfg.ppl.first_window = c.value("ppl_first_window", 0);
    cfg.ppl.window_tokens = c.at("window_tokens").get<int>();
    cfg.ppl.tail_from = c.at("ppl_tail_from").get<int>();
    cfg.fidelity.n_windows = c.value("fidelity_windows", 0);
    cfg.fidelity.window_tokens = cfg.ppl.window_tokens;
    cfg.fidelity.stride = c.value("fidelity_stride", cfg.fidelity.stride);
    cfg.niah_lengths = c.at("niah_lengths").get<std::vector<int>>();
    cfg.niah_per_length = c.at("niah_per_length").get<int>();
    cfg.niah_skip = c.value("niah_skip", 0);
    r.n_dev_tokens = j.value("n_dev_tokens", int64_t{0});
    r.tokenize_seconds = j.value("tokenize_seconds", 0.0);
    r.reference_seconds = j.value("reference_seconds", 0.0);
    r.seconds = j.value("seconds", 0.0);
    for (const json& mj : j.at("modes")) r.modes.push_back(parse_mode(mj));
    return r;
  } catch (const json::exception& e) {
    return invalid_argument("eval report %s: %s", path.c_str(), e.what());
  }
}

Result<EvalReport> merge_reports(const std::vector<EvalReport>& parts) {
  if (parts.empty()) return invalid_argument("eval merge: no reports");
  EvalReport out;
  out.config = parts.front().config;
  EvalConfig& cfg = out.config;
  cfg.modes.clear();
  cfg.niah_lengths.clear();
  cfg.ppl.first_window = 0;
  cfg.niah_skip = 0;
  out.info.command_line = str_format("merge of %zu reports", parts.size());
  out.info.date = parts.front().info.date;
  out.info.machine = parts.front().info.machine;
  out.info.git_commit = parts.front().info.git_commit;
  for (const EvalReport& p : parts) {
    if (p.config.ppl.window_tokens != cfg.ppl.window_tokens ||
        p.config.ppl.tail_from != cfg.ppl.tail_from)
      return invalid_argument(
          "eval merge: report '%s' uses windows of %d (tail from %d), the first uses %d (%d)",
          p.info.command_line.c_str(), p.config.ppl.window_tokens, p.config.ppl.tail_from,
          cfg.ppl.window_tokens, cfg.ppl.tail_from);
    out.info.merged_from.push_back(p.info.command_line + "  [" + p.info.date + ", " +
                                   p.info.machine + ", " + p.info.git_commit + "]");
    out.n_dev_tokens = std::max(out.n_dev_tokens, p.n_dev_tokens);
    out.tokenize_seconds += p.tokenize_seconds;
    out.reference_seconds += p.reference_seconds;
    out.seconds += p.seconds;
    for (int len : p.config.niah_lengths)
      if (std::find(cfg.niah_lengths.begin(), cfg.niah_lengths.end(), len) ==
          cfg.niah_lengths.end())
        cfg.niah_lengths.push_back(len);
    for (const ModeReport& m : p.modes) {
      auto it = std::find_if(out.modes.begin(), out.modes.end(),
                             [&](const ModeReport& x) { return x.mode == m.mode; });
      if (it == out.modes.end()) {
        ModeReport fresh;
        fresh.mode = m.mode;
        fresh.supported = m.supported;
        fresh.error = m.error;
        out.modes.push_back(std::move(fresh));
        cfg.modes.push_back(m.mode);
        it = std::prev(out.modes.end());
      }
      if (!m.supported) continue;
      it->supported = true;
      merge_into(*it, m);
    }
  }
  std::sort(cfg.niah_lengths.begin(), cfg.niah_lengths.end());
  cfg.ppl.n_windows = 0;
  cfg.niah_per_length = 0;
  for (const ModeReport& m : out.modes) {
    if (m.ppl) cfg.ppl.n_windows = std::max(cfg.ppl.n_windows, m.ppl->n_windows);
    if (m.niah)
      for (const NiahLengthResult& l : m.niah->per_length)
        cfg.niah_per_length = std::max(cfg.niah_per_length, l.n);
  }
  return out;
}

}  // namespace oscar::eval
