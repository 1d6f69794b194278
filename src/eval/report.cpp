#include "eval/report.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

namespace oscar::eval {

namespace {

std::string length_label(int len) {
  return len % 1024 == 0 ? str_format("%dK", len / 1024) : str_format("%d", len);
}

std::string pad(const std::string& s, size_t w) {
  return s.size() >= w ? s : std::string(w - s.size(), ' ') + s;
}

const NiahLengthResult* niah_at(const ModeReport& m, int len) {
  if (!m.niah) return nullptr;
  for (const NiahLengthResult& l : m.niah->per_length)
    if (l.target_len == len) return &l;
  return nullptr;
}

std::string xml_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '&') o += "&amp;";
    else if (c == '"') o += "&quot;";
    else o += c;
  }
  return o;
}

}  // namespace

std::string format_table(const EvalReport& r) {
  const EvalConfig& c = r.config;
  std::vector<std::string> head = {"mode", "bits hist", "bits@128K", "ppl",
                                   str_format("ppl>=%d", c.ppl.tail_from)};
  for (int len : c.niah_lengths) head.push_back("NIAH " + length_label(len));
  head.push_back("logit KL");
  head.push_back("out err");
  std::vector<std::vector<std::string>> rows;
  for (const ModeReport& m : r.modes) {
    std::vector<std::string> row = {m.mode};
    if (!m.supported) {
      row.push_back("unsupported: " + m.error.substr(0, 80));
      rows.push_back(row);
      continue;
    }
    row.push_back(m.bits && m.bits->hist_tokens > 0 ? str_format("%.3f", m.bits->bits_hist) : "-");
    row.push_back(m.bits ? str_format("%.3f", m.bits->bits_at(int64_t{128} * 1024)) : "-");
    row.push_back(m.ppl ? str_format("%.4f", m.ppl->ppl()) : "-");
    row.push_back(m.ppl ? str_format("%.4f", m.ppl->ppl_tail()) : "-");
    for (int len : c.niah_lengths) {
      const NiahLengthResult* l = niah_at(m, len);
      if (!l) row.push_back("-");
      else if (l->n == c.niah_per_length) row.push_back(str_format("%.2f", l->accuracy()));
      else row.push_back(str_format("%.2f (n=%d)", l->accuracy(), l->n));
    }
    row.push_back(m.fidelity ? str_format("%.5f", m.fidelity->logit_kl) : "-");
    row.push_back(m.fidelity ? str_format("%.4f", m.fidelity->mean_out_err()) : "-");
    rows.push_back(row);
  }
  std::vector<size_t> w(head.size());
  for (size_t i = 0; i < head.size(); ++i) w[i] = head[i].size();
  for (const auto& row : rows)
    if (row.size() == head.size())
      for (size_t i = 0; i < row.size(); ++i) w[i] = std::max(w[i], row[i].size());
  std::string out;
  auto line = [&](const std::vector<std::string>& cells) {
    for (size_t i = 0; i < cells.size(); ++i) {
      if (i == 0) {
        out += cells[i] + std::string(w[0] - std::min(w[0], cells[i].size()), ' ');
      } else if (cells.size() == head.size()) {
        out += "  " + pad(cells[i], w[i]);
      } else {
        out += "  " + cells[i];
      }
    }
    out += '\n';
  };
  line(head);
  size_t total = 0;
  for (size_t x : w) total += x + 2;
  out += std::string(total - 2, '-') + '\n';
  for (const auto& row : rows) line(row);
  return out;
}

nlohmann::json report_json(const EvalReport& r) {
  using nlohmann::json;
  const EvalConfig& c = r.config;
  json j;
  j["command_line"] = r.info.command_line;
  j["date"] = r.info.date;
  j["machine"] = r.info.machine;
  j["git_commit"] = r.info.git_commit;
  if (!r.info.merged_from.empty()) j["merged_from"] = r.info.merged_from;
  j["config"] = {
      {"model", c.runtime.model_dir},
      {"modes", c.modes},
      {"n_sink", c.runtime.n_sink},
      {"n_recent", c.runtime.n_recent},
      {"page_size", c.runtime.page_size},
      {"group_size", c.runtime.group_size},
      {"k_clip_override", c.runtime.k_clip},
      {"v_clip_override", c.runtime.v_clip},
      {"kv_bits", c.runtime.kv_bits},
      {"rotations", c.runtime.rotations},
      {"dev_text", c.dev_text},
      {"niah_file", c.niah_file},
      {"ppl_windows", c.ppl.n_windows},
      {"ppl_first_window", c.ppl.first_window},
      {"window_tokens", c.ppl.window_tokens},
      {"ppl_tail_from", c.ppl.tail_from},
      {"ppl_attend_mode", "decode-equivalent"},
      {"fidelity_windows", c.fidelity.n_windows},
      {"fidelity_steps", fidelity_steps(c.fidelity.window_tokens, c.fidelity.n_score_steps)},
      {"fidelity_stride", c.fidelity.stride},
      {"niah_lengths", c.niah_lengths},
      {"niah_per_length", c.niah_per_length},
      {"niah_skip", c.niah_skip},
  };
  j["n_dev_tokens"] = r.n_dev_tokens;
  j["tokenize_seconds"] = r.tokenize_seconds;
  j["reference_seconds"] = r.reference_seconds;
  j["seconds"] = r.seconds;
  json modes = json::array();
  for (const ModeReport& m : r.modes) {
    json mj = {{"mode", m.mode}, {"supported", m.supported}, {"seconds", m.seconds}};
    if (!m.supported) mj["error"] = m.error;
    if (!m.describe.empty()) mj["runtime"] = m.describe;
    if (m.ppl) {
      const PplResult& p = *m.ppl;
      mj["ppl"] = {{"ppl", p.ppl()},
                   {"ppl_tail", p.ppl_tail()},
                   {"n_windows", p.n_windows},
                   {"n_predictions", p.n_predictions},
                   {"n_tail", p.n_tail},
                   {"mean_nll", p.n_predictions ? p.nll_sum / p.n_predictions : 0.0},
                   {"seconds", p.seconds},
                   {"seconds_per_window", p.n_windows ? p.seconds / p.n_windows : 0.0},
                   {"window_mean_nll", p.window_nll}};
    }
    if (m.fidelity) {
      const FidelityResult& f = *m.fidelity;
      mj["fidelity"] = {{"score_kl_per_layer", f.score_kl},
                        {"out_rel_err_per_layer", f.out_err},
                        {"mean_score_kl", f.mean_score_kl()},
                        {"mean_out_rel_err", f.mean_out_err()},
                        {"hidden_rel_err", f.hidden_err},
                        {"logit_kl", f.logit_kl},
                        {"score_check_max_rel_err", f.score_check_max_err},
                        {"n_windows", f.n_windows},
                        {"seconds", f.seconds}};
    }
    if (m.niah) {
      json lens = json::array();
      for (const NiahLengthResult& l : m.niah->per_length)
        lens.push_back({{"target_len", l.target_len},
                        {"n", l.n},
                        {"correct", l.correct},
                        {"accuracy", l.accuracy()},
                        {"token_count_mismatches", l.token_count_mismatches}});
      mj["niah"] = {{"per_length", lens}, {"seconds", m.niah->seconds}};
    }
    if (m.bits) {
      const CacheBits& b = *m.bits;
      mj["bits"] = {{"measured_after_prefill_tokens", b.n_tokens},
                    {"hist_tokens", b.hist_tokens},
                    {"bytes_sink", b.bytes.sink},
                    {"bytes_history", b.bytes.history},
                    {"bytes_recent", b.bytes.recent},
                    {"bytes_total", b.bytes.total()},
                    {"elements_per_token", b.elems_per_token},
                    {"bits_hist", b.bits_hist},
                    {"bits_total_measured", b.bits_total},
                    {"bits_total_32k", b.bits_at(int64_t{32} * 1024)},
                    {"bits_total_128k", b.bits_at(int64_t{128} * 1024)}};
    }
    modes.push_back(std::move(mj));
  }
  j["modes"] = std::move(modes);
  return j;
}

std::string render_svg(const EvalReport& r) {
  static const char* kColors[] = {"#222222", "#d62728", "#ff7f0e", "#1f77b4",
                                  "#2ca02c", "#9467bd", "#8c564b", "#e377c2"};
  const int W = 960, H = 400;
  std::string s = str_format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
      "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
      W, H, W, H);
  std::vector<const ModeReport*> modes;
  for (const ModeReport& m : r.modes)
    if (m.supported) modes.push_back(&m);
  auto color = [&](size_t i) { return kColors[i % (sizeof(kColors) / sizeof(kColors[0]))]; };

  // Left panel: NIAH accuracy vs length (x evenly spaced by length index, i.e. log2 for 1K..8K).
  const double lx0 = 70, lx1 = 420, ly0 = 50, ly1 = 340;
  s += str_format("<text x=\"%.0f\" y=\"28\" font-size=\"14\" text-anchor=\"middle\">NIAH accuracy "
                  "vs context length</text>\n", (lx0 + lx1) / 2);
  const std::vector<int>& lens = r.config.niah_lengths;
  auto xl = [&](size_t i) {
    return lens.size() <= 1 ? (lx0 + lx1) / 2 : lx0 + (lx1 - lx0) * i / (lens.size() - 1.0);
  };
  auto yl = [&](double acc) { return ly1 - (ly1 - ly0) * acc; };
  for (int t = 0; t <= 5; ++t) {
    const double y = yl(t / 5.0);
    s += str_format("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                    "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%.1f</text>\n",
                    lx0, y, lx1, y, lx0 - 6, y + 4, t / 5.0);
  }
  for (size_t i = 0; i < lens.size(); ++i)
    s += str_format("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n", xl(i),
                    ly1 + 18, length_label(lens[i]).c_str());
  s += str_format("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">prompt + answer tokens"
                  "</text>\n", (lx0 + lx1) / 2, ly1 + 36);
  s += str_format("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>"
                  "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n",
                  lx0, ly0, lx0, ly1, lx0, ly1, lx1, ly1);
  for (size_t k = 0; k < modes.size(); ++k) {
    std::string pts;
    for (size_t i = 0; i < lens.size(); ++i) {
      const NiahLengthResult* l = niah_at(*modes[k], lens[i]);
      if (!l) continue;
      pts += str_format("%.1f,%.1f ", xl(i), yl(l->accuracy()));
      s += str_format("<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", xl(i),
                      yl(l->accuracy()), color(k));
    }
    if (!pts.empty())
      s += str_format("<polyline points=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"2\"/>\n",
                      pts.c_str(), color(k));
    s += str_format("<rect x=\"%.0f\" y=\"%.0f\" width=\"12\" height=\"3\" fill=\"%s\"/>"
                    "<text x=\"%.0f\" y=\"%.0f\">%s</text>\n",
                    lx0 + 10, ly0 + 8 + 16.0 * k, color(k), lx0 + 28, ly0 + 13 + 16.0 * k,
                    xml_escape(modes[k]->mode).c_str());
  }

  // Right panel: perplexity bars, the axis starting at 0.9 x the smallest value.
  const double bx0 = 540, bx1 = 920, by0 = 50, by1 = 340;
  s += str_format("<text x=\"%.0f\" y=\"28\" font-size=\"14\" text-anchor=\"middle\">Perplexity "
                  "(dev_eval, %d windows of %d)</text>\n", (bx0 + bx1) / 2,
                  r.config.ppl.n_windows, r.config.ppl.window_tokens);
  double lo = 1e30, hi = 0;
  for (const ModeReport* m : modes)
    if (m->ppl) lo = std::min(lo, m->ppl->ppl()), hi = std::max(hi, m->ppl->ppl());
  if (hi > 0) {
    const double base = std::floor(lo * 0.9 * 10) / 10, top = hi + (hi - base) * 0.1 + 1e-9;
    auto yb = [&](double v) { return by1 - (by1 - by0) * (v - base) / (top - base); };
    for (int t = 0; t <= 4; ++t) {
      const double v = base + (top - base) * t / 4;
      s += str_format("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                      "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%.2f</text>\n",
                      bx0, yb(v), bx1, yb(v), bx0 - 6, yb(v) + 4, v);
    }
    const double slot = (bx1 - bx0) / std::max<size_t>(modes.size(), 1);
    for (size_t k = 0; k < modes.size(); ++k) {
      if (!modes[k]->ppl) continue;
      const double v = modes[k]->ppl->ppl(), x = bx0 + slot * k + slot * 0.15;
      s += str_format("<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\"/>"
                      "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%.3f</text>"
                      "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n",
                      x, yb(v), slot * 0.7, by1 - yb(v), color(k), x + slot * 0.35, yb(v) - 4, v,
                      x + slot * 0.35, by1 + 18, xml_escape(modes[k]->mode).c_str());
    }
    s += str_format("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>"
                    "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n",
                    bx0, by0, bx0, by1, bx0, by1, bx1, by1);
  }
  s += str_format("<text x=\"%d\" y=\"%d\" fill=\"#666\">%s</text>\n", 10, H - 10,
                  xml_escape(r.info.date + "  " + r.info.git_commit.substr(0, 12) + "  " +
                             r.info.machine).c_str());
  s += "</svg>\n";
  return s;
}

Status write_report(const EvalReport& report, const std::string& out_prefix) {
  const std::filesystem::path prefix(out_prefix);
  std::error_code ec;
  if (prefix.has_parent_path()) std::filesystem::create_directories(prefix.parent_path(), ec);
  if (ec)
    return invalid_argument("cannot create %s: %s", prefix.parent_path().c_str(),
                            ec.message().c_str());
  auto write = [](const std::string& path, const std::string& text) -> Status {
    std::ofstream out(path, std::ios::binary);
    out << text;
    out.close();
    if (!out) return invalid_argument("cannot write %s", path.c_str());
    return Status();
  };
  OSCAR_RETURN_IF_ERROR(write(out_prefix + ".json", report_json(report).dump(2) + "\n"));
  return write(out_prefix + ".svg", render_svg(report));
}

}  // namespace oscar::eval
