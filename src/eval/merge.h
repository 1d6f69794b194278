// Reading `oscar eval` JSON reports back and merging shards into one report, so runs split by
// mode, by perplexity windows (--ppl-first-window) or by NIAH prompts (--niah-skip) render as ONE
// side-by-side table, JSON and SVG (`oscar eval --merge a.json b.json … --out X`).
//
// Merge rules, per mode label (modes appear in first-seen order):
//   ppl       losses add: n_predictions, nll sums (from mean_nll and ppl_tail), windows, seconds;
//             per-window losses are concatenated in file order (shards must not overlap: the
//             caller's job, not checked beyond the window count).
//   NIAH      per target length, prompt counts and correct answers add.
//   fidelity  the first shard that has it (fidelity needs its own bf16 reference; not additive).
//   bits      the shard whose measured prefill was longest (ties: the first).
// Config: the first shard's, with niah_lengths = union (ascending), ppl.n_windows = the most
// windows any merged mode has, and niah_per_length = the most prompts any length has.
// RunInfo.command_line says "merge of N reports"; each shard's command line, date, machine and
// commit are kept in RunInfo.merged_from.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"
#include "eval/evaluate.h"

namespace oscar::eval {

// Parses a report written by write_report() (the fields the table, JSON and SVG use).
// InvalidArgument names the file and the missing or mistyped field.
Result<EvalReport> read_report_json(const std::string& path);

// Merges reports by the rules above. InvalidArgument on an empty list or when shards disagree on
// window_tokens or ppl_tail_from (their losses would not be comparable).
Result<EvalReport> merge_reports(const std::vector<EvalReport>& parts);

}  // namespace oscar::eval
