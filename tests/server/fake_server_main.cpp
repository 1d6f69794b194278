// oscar_fake_server: serves the FakeEngine (tests/server/fake_engine.h) through the real
// HttpServer, for the OpenAI conformance tests in tests/e2e/openai_conformance/. Test-only.
//   oscar_fake_server [--port N] [--host H] [--api-key KEY] [--token-delay-ms D]
//                     [--ready-after-ms T] [--max-context N] [--echo-last-content]
//                     [--reasoning-parser qwen3]
// --echo-last-content: a chat's "output" is its last message's content, so a client test can
// script what the model says (tool calls included) and drive a whole tool loop.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "server/http_server.h"
#include "tests/server/fake_engine.h"

int main(int argc, char** argv) {
  oscar::server::ServerOptions opt;
  opt.port = 8000;
  oscar::server::testing::FakeEngine::Options eopt;
  int ready_after_ms = 0;
  for (int i = 1; i < argc; ++i) {
    auto next = [&](const char* flag) -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "oscar_fake_server: %s needs a value\n", flag);
        std::exit(2);
      }
      return argv[++i];
    };
    if (!std::strcmp(argv[i], "--port")) opt.port = static_cast<uint16_t>(std::atoi(next("--port")));
    else if (!std::strcmp(argv[i], "--host")) opt.host = next("--host");
    else if (!std::strcmp(argv[i], "--api-key")) opt.api_key = next("--api-key");
    else if (!std::strcmp(argv[i], "--token-delay-ms"))
      eopt.token_delay = std::chrono::milliseconds(std::atoi(next("--token-delay-ms")));
    else if (!std::strcmp(argv[i], "--ready-after-ms")) ready_after_ms = std::atoi(next("--ready-after-ms"));
    else if (!std::strcmp(argv[i], "--max-context")) eopt.max_context_tokens = std::atoi(next("--max-context"));
    else if (!std::strcmp(argv[i], "--echo-last-content")) eopt.chat_prompt_is_last_content = true;
    else if (!std::strcmp(argv[i], "--reasoning-parser")) opt.reasoning_parser = next("--reasoning-parser");
    else {
      std::fprintf(stderr, "oscar_fake_server: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  eopt.ready = ready_after_ms == 0;
  oscar::server::testing::FakeEngine engine(eopt);
  std::thread warmup;
  if (ready_after_ms > 0) {
    warmup = std::thread([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(ready_after_ms));
      engine.set_ready(true);
    });
    warmup.detach();
  }
  oscar::Status st = oscar::server::serve_until_signal(&engine, opt);
  if (!st.ok()) {
    std::fprintf(stderr, "oscar_fake_server: %s\n", st.to_string().c_str());
    return 1;
  }
  return 0;
}
