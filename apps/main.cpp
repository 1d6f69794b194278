// `oscar`: one executable, one subcommand per job. Thin: parsing and dispatch only.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <map>

#include "apps/commands.h"
#include "core/omp_env.h"

int main(int argc, char** argv) {
  oscar::set_omp_wait_policy(argv);
  CLI::App app{"oscar: long-context LLM inference with an attention-aware 2-bit KV cache"};
  app.require_subcommand(1);
  std::map<CLI::App*, oscar::apps::Command> commands;
  auto add = [&](const char* name, const char* help, auto adder) {
    CLI::App* sub = app.add_subcommand(name, help);
    commands[sub] = adder(*sub);
  };
  add("run", "Generate a continuation of a prompt, streamed to stdout", oscar::apps::add_run);
  add("tokenize", "Print the token ids of a text (or decode ids with --decode)",
      oscar::apps::add_tokenize);
  add("inspect", "Print a model's config, tensor table and memory needs", oscar::apps::add_inspect);
  add("serve", "Serve the model over an OpenAI-compatible HTTP API", oscar::apps::add_serve);
  add("calibrate", "Calibrate OSCAR rotations and clip ratios, write a rotation file",
      oscar::apps::add_calibrate);
  add("eval", "Perplexity, attention fidelity, NIAH and bits per element of KV-cache modes",
      oscar::apps::add_eval);
  add("import-rotations",
      "Convert a K/V pair of the OSCAR release's published rotations (RotationZoo .pt) into a "
      "rotation file", oscar::apps::add_import_rotations);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  for (auto& [sub, run] : commands)
    if (sub->parsed()) return run();
  return 1;
}
