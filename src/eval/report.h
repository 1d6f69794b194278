// Rendering of an EvalReport (evaluate.h): the terminal table (modes as rows), the
// machine-readable JSON (command line, date, machine, git commit, every measured value) and an SVG
// figure written by hand (NIAH accuracy vs context length per mode; perplexity bars). No file
// system access except write_report().
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "core/status.h"
#include "eval/evaluate.h"

namespace oscar::eval {

// Columns: mode, bits hist, bits total @128K, ppl, ppl >= tail, NIAH per length, logit KL,
// attention-output error (mean over layers). Unsupported modes show the reason.
std::string format_table(const EvalReport& report);

nlohmann::json report_json(const EvalReport& report);

std::string render_svg(const EvalReport& report);

// Writes <out_prefix>.json and <out_prefix>.svg (creating the parent directory).
Status write_report(const EvalReport& report, const std::string& out_prefix);

}  // namespace oscar::eval
