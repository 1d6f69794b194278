// The `oscar` subcommands. Each registers its options on the CLI11 app (name, default and help
// declared once) and returns the function that runs it.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace oscar::apps {

using Command = std::function<int()>;

Command add_run(CLI::App& app);
Command add_tokenize(CLI::App& app);
Command add_inspect(CLI::App& app);
Command add_serve(CLI::App& app);
Command add_calibrate(CLI::App& app);
Command add_eval(CLI::App& app);
Command add_import_rotations(CLI::App& app);

}  // namespace oscar::apps
