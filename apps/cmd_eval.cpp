// `oscar eval`: perplexity, attention fidelity, NIAH accuracy and measured bits per element of
// several KV-cache modes in one run (library: src/eval/). Prints the table, writes
// <out>.json and <out>.svg.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "apps/commands.h"
#include "apps/runtime_options.h"
#include "core/log.h"
#include "eval/evaluate.h"
#include "eval/merge.h"
#include "eval/report.h"
#include "kernels/backend.h"

namespace oscar::apps {

namespace {

std::string command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (char& c : all)
    if (c == '\0') c = ' ';
  while (!all.empty() && all.back() == ' ') all.pop_back();
  return all;
}

std::string shell_line(const char* cmd) {
  std::string out;
  if (FILE* p = popen(cmd, "r")) {
    char buf[256];
    while (std::fgets(buf, sizeof(buf), p)) out += buf;
    pclose(p);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

std::string machine() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, cpu = "unknown CPU";
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      cpu = line.substr(line.find(':') + 2);
      break;
    }
  char host[256] = "";
  gethostname(host, sizeof(host) - 1);
  return str_format("%s, %s, %u hardware threads", host, cpu.c_str(),
                    std::thread::hardware_concurrency());
}

std::string git_commit() {
  std::string c = shell_line("git rev-parse HEAD 2>/dev/null");
  if (c.size() != 40) return "unknown (not a git checkout)";  // `git rev-parse` echoes "HEAD"
  if (!shell_line("git status --porcelain --untracked-files=no 2>/dev/null").empty())
    c += " (working tree has uncommitted changes)";
  return c;
}

// The default output prefix: oscar-eval-<UTC time> in the current directory, with -2, -3, ...
// appended while <prefix>.json or <prefix>.svg exists, so that a run never overwrites a report
// (the committed docs/results/eval.json included) unless --out names it.
std::string fresh_out_prefix() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y%m%dT%H%M%SZ", &tm);
  const std::string base = std::string("oscar-eval-") + stamp;
  std::string prefix = base;
  for (int i = 2; std::filesystem::exists(prefix + ".json") ||
                  std::filesystem::exists(prefix + ".svg");
       ++i) {
    prefix = base + "-" + std::to_string(i);
  }
  return prefix;
}

}  // namespace

Command add_eval(CLI::App& app) {
  auto cfg = std::make_shared<eval::EvalConfig>();
  auto out = std::make_shared<std::string>();  // "": fresh_out_prefix()
  auto no_progress = std::make_shared<bool>(false);
  auto merge = std::make_shared<std::vector<std::string>>();
  add_runtime_options(app, cfg->runtime);
  app.remove_option(app.get_option("--kv-cache"));  // eval takes a list: --modes
  app.add_option("--modes", cfg->modes,
                 "Comma-separated cache modes, evaluated side by side (bf16, f32, int2-naive, "
                 "int2-hadamard, kivi2, oscar, oscar-lloyd); a mode may carry ':'-separated "
                 "overrides, e.g. oscar-lloyd:k=1:v=1, oscar:rot=FILE:k=0.98 (k, v, rot, sink, "
                 "recent, plan=0|1)")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--ppl-windows", cfg->ppl.n_windows, "Perplexity windows (0 = skip)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--ppl-first-window", cfg->ppl.first_window,
                 "First perplexity window (windows of a shard: first .. first + n - 1)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--window-tokens", cfg->ppl.window_tokens,
                 "Predictions per perplexity window (a window holds this + 1 tokens)")
      ->capture_default_str()
      ->check(CLI::Range(2, 32767));
  app.add_option("--ppl-tail-from", cfg->ppl.tail_from,
                 "Also report perplexity over positions >= this")
      ->capture_default_str();
  app.add_option("--niah-lengths", cfg->niah_lengths, "NIAH target lengths")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--niah-per-length", cfg->niah_per_length, "NIAH prompts per length (0 = skip)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--niah-skip", cfg->niah_skip,
                 "Skip this many NIAH prompts of each length first (shards)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  CLI::Option* fidelity_windows =
      app.add_option("--fidelity-windows", cfg->fidelity.n_windows,
                     "Windows for attention fidelity vs bf16 (0 = skip; CPU only: the default "
                     "is 0 on a GPU, and a count given there is an error)")
          ->capture_default_str()
          ->check(CLI::NonNegativeNumber);
  app.add_option("--fidelity-steps", cfg->fidelity.n_score_steps,
                 "Single-token score steps per fidelity window")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--dev-text", cfg->dev_text, "Perplexity text (default DIR/data/dev_eval.txt)");
  app.add_option("--niah-file", cfg->niah_file, "NIAH prompts (default DIR/data/niah_dev.jsonl)");
  app.add_option("-o,--out", *out,
                 "Output prefix: writes <out>.json and <out>.svg (default: a fresh "
                 "oscar-eval-<UTC time> in the current directory; never overwrites)");
  app.add_flag("--no-progress", *no_progress, "No progress bars");
  app.add_option("--merge", *merge,
                 "Run nothing: merge these eval JSON reports (shards by mode, ppl windows or NIAH "
                 "prompts) into one table, <out>.json and <out>.svg; an argument PATH.json:OLD=NEW "
                 "relabels mode OLD of that file (NEW without '='), PATH.json:OLD= leaves it out")
      ->expected(1, -1);

  return [=]() -> int {
    if (out->empty()) *out = fresh_out_prefix();
    if (!merge->empty()) {
      std::vector<eval::EvalReport> parts;
      for (const std::string& arg : *merge) {
        // PATH or PATH.json:OLD=NEW: relabel mode OLD of that file before merging (an empty NEW
        // leaves the mode out). OLD may hold ':' and '=' (mode overrides); NEW is what follows
        // the last '='.
        std::string path = arg, from, to;
        const size_t cut = arg.find(".json:");
        if (cut != std::string::npos) {
          path = arg.substr(0, cut + 5);
          const std::string rest = arg.substr(cut + 6);
          const size_t eq = rest.rfind('=');
          if (eq == std::string::npos || eq == 0) {
            std::fprintf(stderr, "error: --merge %s: expected PATH.json:OLD=NEW or PATH.json:OLD=\n",
                         arg.c_str());
            return 1;
          }
          from = rest.substr(0, eq);
          to = rest.substr(eq + 1);
        }
        auto part = eval::read_report_json(path);
        if (!part.ok()) {
          std::fprintf(stderr, "error: %s\n", part.status().message().c_str());
          return 1;
        }
        std::vector<eval::ModeReport>& modes = part.value().modes;
        if (!from.empty()) {
          const bool found = std::any_of(modes.begin(), modes.end(),
                                         [&](const eval::ModeReport& m) { return m.mode == from; });
          if (!found) {
            std::fprintf(stderr, "error: --merge %s: %s has no mode '%s'\n", arg.c_str(),
                         path.c_str(), from.c_str());
            return 1;
          }
          for (eval::ModeReport& m : modes)
            if (m.mode == from) m.mode = to;
          std::erase_if(modes, [](const eval::ModeReport& m) { return m.mode.empty(); });
        }
        parts.push_back(std::move(part.value()));
      }
      auto merged = eval::merge_reports(parts);
      if (!merged.ok()) {
        std::fprintf(stderr, "error: %s\n", merged.status().message().c_str());
        return 1;
      }
      merged.value().info.command_line = command_line();
      std::fputs(eval::format_table(merged.value()).c_str(), stdout);
      const Status st = eval::write_report(merged.value(), *out);
      if (!st.ok()) {
        std::fprintf(stderr, "error: %s\n", st.message().c_str());
        return 1;
      }
      std::printf("wrote %s.json and %s.svg\n", out->c_str(), out->c_str());
      return 0;
    }
    cfg->progress = !*no_progress;
    // Fidelity runs on the CPU only (eval::check_fidelity_device): on a GPU its default becomes
    // 0, with a note; a count given there is refused by run_evaluation before any work.
    if (cfg->fidelity.n_windows > 0 && fidelity_windows->count() == 0 &&
        cfg->runtime.device != "cpu") {
      auto backend = kernels::make_backend(cfg->runtime.device);
      if (backend.ok() && backend.value()->device() != Device::kCpu) {
        OSCAR_LOG_INFO(
            "eval: fidelity_windows=0 (attention fidelity runs on the CPU only; "
            "--device cpu --fidelity-windows N measures it)");
        cfg->fidelity.n_windows = 0;
      }
    }
    auto report = eval::run_evaluation(*cfg);
    if (!report.ok()) {
      std::fprintf(stderr, "error: %s\n", report.status().message().c_str());
      return 1;
    }
    eval::EvalReport& r = report.value();
    r.info.command_line = command_line();
    r.info.date = utc_now();
    r.info.machine = machine();
    r.info.git_commit = git_commit();
    std::fputs(eval::format_table(r).c_str(), stdout);
    std::printf("wall %.1f s (tokenize %.1f s, bf16 fidelity reference %.1f s)\n", r.seconds,
                r.tokenize_seconds, r.reference_seconds);
    for (const eval::ModeReport& m : r.modes)
      if (m.supported)
        std::printf("  %-14s %.1f s (ppl %.1f s, fidelity %.1f s, niah %.1f s)\n", m.mode.c_str(),
                    m.seconds, m.ppl ? m.ppl->seconds : 0.0,
                    m.fidelity ? m.fidelity->seconds : 0.0, m.niah ? m.niah->seconds : 0.0);
    const Status st = eval::write_report(r, *out);
    if (!st.ok()) {
      std::fprintf(stderr, "error: %s\n", st.message().c_str());
      return 1;
    }
    std::printf("wrote %s.json and %s.svg\n", out->c_str(), out->c_str());
    return 0;
  };
}

}  // namespace oscar::apps
