#include "eval/evaluate.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>

#include "core/log.h"
#include "core/progress.h"
#include "eval/eval_data.h"
#include "kernels/backend.h"
#include "quant/modes.h"
#include "tokenizer/tokenizer.h"

namespace oscar::eval {

namespace {

using Clock = std::chrono::steady_clock;

// One phase's progress: the shared bar (core/progress.h, stderr) when enabled, then a result line.
class Phase {
 public:
  Phase(bool enabled, const std::string& label, int64_t total, const char* unit) : label_(label) {
    if (enabled && total > 0) bar_.emplace(label, total, unit);
  }
  void update(int64_t done, int64_t units) {
    if (bar_) bar_->update(done, units);
  }
  void finish(const std::string& result = "") {
    if (!bar_) return;
    bar_->finish();
    if (!result.empty()) std::fprintf(stderr, "%s: %s\n", label_.c_str(), result.c_str());
  }

 private:
  std::string label_;
  std::optional<ProgressBar> bar_;
};

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Prefills the first `n` dev tokens (when no NIAH prompt was run) to measure the cache's bytes.
Result<PrefillSnapshot> prefill_snapshot(engine::Runtime& rt, std::span<const int32_t> tokens,
                                         int64_t n) {
  n = std::min<int64_t>(n, static_cast<int64_t>(tokens.size()));
  auto cache = rt.new_cache();
  std::vector<float> logits;
  OSCAR_RETURN_IF_ERROR(rt.model().forward_one(tokens.first(static_cast<size_t>(n)), *cache,
                                               &logits));
  PrefillSnapshot s;
  s.n_tokens = cache->n_tokens();
  s.hist_tokens = rt.spec().quantized()
                      ? std::max<int64_t>(0, cache->hist_end() - rt.spec().regions.n_sink)
                      : 0;
  s.bytes = cache->bytes();
  return s;
}

Status run_mode(const EvalConfig& cfg, std::span<const int32_t> dev,
                const std::vector<NiahCase>& niah, const FidelityCapture* reference,
                ModeReport& out) {
  const auto t0 = Clock::now();
  auto parsed = apply_mode_variant(out.mode, cfg.runtime);
  if (!parsed.ok()) return parsed.status();
  engine::RuntimeOptions ro = std::move(parsed.value());
  // Clip overrides are for oscar modes only (make_cache_spec would apply them to any mode).
  {
    const auto m = quant::parse_cache_mode(ro.cache_mode);
    if (!m.ok() || !quant::cache_mode_is_oscar(m.value())) ro.k_clip = ro.v_clip = -1.f;
    if (!m.ok() || m.value() != quant::CacheMode::kOscar) ro.kv_bits = 0.0;
  }
  auto created = engine::Runtime::create(ro);
  if (!created.ok()) {
    out.supported = false;
    out.error = created.status().message();
    OSCAR_LOG_WARN("eval: mode=%s unsupported: %s", out.mode.c_str(), out.error.c_str());
    return Status();
  }
  engine::Runtime& rt = *created.value();
  out.describe = rt.describe();

  if (cfg.ppl.n_windows > 0) {
    Phase bar(cfg.progress, out.mode + " ppl", cfg.ppl.n_windows, "tok");
    OSCAR_ASSIGN_OR_RETURN(
        PplResult ppl, evaluate_perplexity(rt, dev, cfg.ppl, [&](int done, const PplResult& r) {
          bar.update(done, r.n_predictions);
        }));
    bar.finish(str_format("ppl %.4f  ppl>=%d %.4f", ppl.ppl(), cfg.ppl.tail_from, ppl.ppl_tail()));
    out.ppl = std::move(ppl);
  }
  if (reference != nullptr) {
    const auto tf = Clock::now();
    Phase bar(cfg.progress, out.mode + " fidelity", 1, "window");
    OSCAR_ASSIGN_OR_RETURN(FidelityCapture cap, capture_fidelity(rt, dev, cfg.fidelity));
    OSCAR_ASSIGN_OR_RETURN(FidelityResult fr, compare_fidelity(*reference, cap));
    fr.seconds = since(tf);
    bar.update(1, cfg.fidelity.n_windows);
    bar.finish(str_format("logit KL %.5f out err %.4f", fr.logit_kl, fr.mean_out_err()));
    out.fidelity = std::move(fr);
  }
  std::optional<PrefillSnapshot> snap;
  if (!niah.empty()) {
    Phase bar(cfg.progress, out.mode + " niah", static_cast<int64_t>(niah.size()), "prompt");
    OSCAR_ASSIGN_OR_RETURN(NiahResult nr,
                           evaluate_niah(rt, niah, [&](int done, const NiahResult& r) {
                             bar.update(done, done);
                           }));
    int c = 0, n = 0;
    for (const auto& l : nr.per_length) c += l.correct, n += l.n;
    bar.finish(str_format("accuracy %d/%d", c, n));
    snap = nr.longest_prefill;
    out.niah = std::move(nr);
  } else {
    const int64_t n = cfg.niah_lengths.empty() ? 8184 : cfg.niah_lengths.back() - 8;
    OSCAR_ASSIGN_OR_RETURN(PrefillSnapshot s, prefill_snapshot(rt, dev, n));
    snap = s;
  }
  out.bits = cache_bits(*snap, rt.spec());
  out.seconds = since(t0);
  return Status();
}

}  // namespace

Result<engine::RuntimeOptions> apply_mode_variant(const std::string& label,
                                                  const engine::RuntimeOptions& base) {
  engine::RuntimeOptions ro = base;
  size_t pos = label.find(':');
  ro.cache_mode = label.substr(0, pos);
  while (pos != std::string::npos) {
    const size_t next = label.find(':', pos + 1);
    const std::string item = label.substr(pos + 1, next == std::string::npos ? std::string::npos
                                                                             : next - pos - 1);
    pos = next;
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == item.size())
      return invalid_argument("eval mode '%s': option '%s' is not key=value", label.c_str(),
                              item.c_str());
    const std::string key = item.substr(0, eq), val = item.substr(eq + 1);
    char* end = nullptr;
    const double num = std::strtod(val.c_str(), &end);
    const bool is_num = end != nullptr && *end == '\0';
    if (key == "rot") {
      ro.rotations = val;
    } else if ((key == "k" || key == "v") && is_num && num > 0.0 && num <= 1.5) {
      (key == "k" ? ro.k_clip : ro.v_clip) = static_cast<float>(num);
    } else if ((key == "sink" || key == "recent") && is_num && num >= 0.0 && num < 1e6 &&
               num == std::floor(num)) {
      (key == "sink" ? ro.n_sink : ro.n_recent) = static_cast<int>(num);
    } else if (key == "plan" && (val == "0" || val == "1")) {
      ro.bit_plan = val == "1";
    } else if (key == "bits" && is_num) {
      ro.kv_bits = num;  // range checked by the runtime (kv::plan_for_bits)
    } else {
      return invalid_argument(
          "eval mode '%s': unknown option or bad value '%s' (use k=RHO, v=RHO with 0 < RHO <= "
          "1.5, rot=FILE, sink=N, recent=N, plan=0|1, bits=X)",
          label.c_str(), item.c_str());
    }
  }
  return ro;
}

Status check_fidelity_device(const EvalConfig& config, Device device) {
  if (config.fidelity.n_windows <= 0 || device == Device::kCpu) return Status();
  return invalid_argument(
      "eval: attention fidelity (--fidelity-windows %d) reads the cache with the CPU kernels and "
      "cannot run on the %s device; pass --fidelity-windows 0, or --device cpu for fidelity",
      config.fidelity.n_windows, device_name(device));
}

Result<EvalReport> run_evaluation(const EvalConfig& config_in) {
  if (config_in.fidelity.n_windows > 0) {  // before any work: the device fidelity would run on
    OSCAR_ASSIGN_OR_RETURN(std::unique_ptr<kernels::Backend> backend,
                           kernels::make_backend(config_in.runtime.device));
    OSCAR_RETURN_IF_ERROR(check_fidelity_device(config_in, backend->device()));
  }
  const auto t0 = Clock::now();
  EvalReport report;
  report.config = config_in;
  EvalConfig& cfg = report.config;
  const std::filesystem::path dir(cfg.runtime.model_dir);
  if (cfg.dev_text.empty()) cfg.dev_text = (dir / "data" / "dev_eval.txt").string();
  if (cfg.niah_file.empty()) cfg.niah_file = (dir / "data" / "niah_dev.jsonl").string();
  cfg.fidelity.window_tokens = cfg.ppl.window_tokens;
  if (cfg.modes.empty()) return invalid_argument("eval: no cache modes given");

  // Data once for all modes (the tokenizer does not depend on the cache mode).
  OSCAR_ASSIGN_OR_RETURN(tok::Tokenizer tok, tok::Tokenizer::load(cfg.runtime.model_dir));
  std::vector<int32_t> dev;
  if (cfg.ppl.n_windows > 0 || cfg.fidelity.n_windows > 0 || cfg.niah_per_length == 0) {
    const auto tt = Clock::now();
    OSCAR_ASSIGN_OR_RETURN(std::string text, read_text_file(cfg.dev_text));
    dev = tok.encode(text);
    report.tokenize_seconds = since(tt);
    report.n_dev_tokens = static_cast<int64_t>(dev.size());
    OSCAR_LOG_INFO("eval: dev_text=%s tokens=%zu tokenize_s=%.2f", cfg.dev_text.c_str(),
                   dev.size(), report.tokenize_seconds);
  }
  std::vector<NiahCase> niah;
  if (cfg.niah_per_length > 0) {
    OSCAR_ASSIGN_OR_RETURN(std::vector<NiahCase> all, load_niah(cfg.niah_file));
    OSCAR_ASSIGN_OR_RETURN(niah, select_niah(all, cfg.niah_lengths, cfg.niah_per_length, cfg.niah_skip));
  }

  std::optional<FidelityCapture> reference;
  if (cfg.fidelity.n_windows > 0) {
    const auto tr = Clock::now();
    engine::RuntimeOptions ro = cfg.runtime;
    ro.cache_mode = "bf16";
    OSCAR_ASSIGN_OR_RETURN(std::unique_ptr<engine::Runtime> rt, engine::Runtime::create(ro));
    Phase bar(cfg.progress, "bf16 reference", 1, "window");
    OSCAR_ASSIGN_OR_RETURN(reference, capture_fidelity(*rt, dev, cfg.fidelity));
    bar.update(1, cfg.fidelity.n_windows);
    bar.finish();
    report.reference_seconds = since(tr);
  }

  for (const std::string& mode : cfg.modes) {
    ModeReport& m = report.modes.emplace_back();
    m.mode = mode;
    OSCAR_RETURN_IF_ERROR(run_mode(cfg, dev, niah, reference ? &*reference : nullptr, m)
                              .with_context("eval mode " + mode));
  }
  report.seconds = since(t0);
  return report;
}

}  // namespace oscar::eval
