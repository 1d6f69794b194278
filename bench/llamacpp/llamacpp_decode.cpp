// llama.cpp's batch-1 decode speed, measured like bench/e2e/bench_model.cpp measures oscar's: a
// prompt of `context` tokens of the same text in one llama_decode, then `decode` tokens one
// llama_decode each (logits computed every step), tokens/s over those. Links the libllama /
// libggml that node-llama-cpp's npm package ships prebuilt (run.sh installs it); llama.cpp's
// headers are not shipped, so the few C declarations used are written here. The parameter
// structs are passed as opaque storage larger than the real ones: only their four leading
// fields, stable across llama.cpp releases, are set (n_ctx, n_batch, n_ubatch, n_seq_max) and
// read back through llama_n_ctx() / llama_n_batch(); the threads go through llama_set_n_threads
// and are read back too (the fields after those four moved between releases).
//
//   llamacpp_decode MODEL.gguf TEXT_FILE BACKEND_DIR [contexts=512,2048,8192] [decode=32]
//                   [threads=2] [flash_attn=auto|on|off]
//
// flash_attn other than auto (llama.cpp's default) is written at the offset where node-llama-cpp
// 3.22.1's build keeps llama_context_params::flash_attn_type (byte 52, after the three enums
// that precede it, all -1 by default); the program refuses when those defaults are not there.
//
// Prints rows like bench_model's: | llama.cpp bNNNN | context | prefill tok/s | decode tok/s |
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

extern "C" {
using llama_token = int32_t;
struct llama_model;
struct llama_context;
struct llama_vocab;
struct llama_memory;
struct Params {  // storage for llama_{model,context}_params (far larger than either)
  alignas(16) unsigned char bytes[1024];
};
struct llama_batch {
  int32_t n_tokens;
  llama_token* token;
  float* embd;
  int32_t* pos;
  int32_t* n_seq_id;
  int32_t** seq_id;
  int8_t* logits;
};
void ggml_backend_load_all_from_path(const char* dir);
void llama_backend_init();
Params llama_model_default_params();
Params llama_context_default_params();
llama_model* llama_model_load_from_file(const char* path, Params params);
llama_context* llama_init_from_model(llama_model* model, Params params);
const llama_vocab* llama_model_get_vocab(const llama_model* model);
int32_t llama_tokenize(const llama_vocab* vocab, const char* text, int32_t text_len,
                       llama_token* tokens, int32_t n_tokens_max, bool add_special,
                       bool parse_special);
llama_batch llama_batch_get_one(llama_token* tokens, int32_t n_tokens);
int32_t llama_decode(llama_context* ctx, llama_batch batch);
float* llama_get_logits_ith(llama_context* ctx, int32_t i);
uint32_t llama_n_ctx(const llama_context* ctx);
uint32_t llama_n_batch(const llama_context* ctx);
void llama_set_n_threads(llama_context* ctx, int32_t n_threads, int32_t n_threads_batch);
int32_t llama_n_threads(llama_context* ctx);
void llama_free(llama_context* ctx);
void llama_model_free(llama_model* model);
}

namespace {

struct ContextParamsHead {  // the leading fields of llama_context_params
  uint32_t n_ctx, n_batch, n_ubatch, n_seq_max;
};

std::vector<int> split_ints(const std::string& s) {
  std::vector<int> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(std::stoi(item));
  return out;
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr,
                 "usage: llamacpp_decode MODEL.gguf TEXT_FILE BACKEND_DIR "
                 "[contexts=512,2048,8192] [decode=32] [threads=2]\n");
    return 2;
  }
  const std::vector<int> contexts = split_ints(argc > 4 ? argv[4] : "512,2048,8192");
  const int decode = argc > 5 ? std::atoi(argv[5]) : 32;
  const int threads = argc > 6 ? std::atoi(argv[6]) : 2;
  const std::string fa = argc > 7 ? argv[7] : "auto";
  constexpr size_t kFlashAttnOffset = 52;
  std::ifstream in(argv[2]);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());

  ggml_backend_load_all_from_path(argv[3]);  // the CPU variant that fits this machine
  llama_backend_init();
  llama_model* model = llama_model_load_from_file(argv[1], llama_model_default_params());
  if (model == nullptr) {
    std::fprintf(stderr, "llamacpp_decode: cannot load %s\n", argv[1]);
    return 1;
  }
  std::vector<llama_token> all(text.size() + 16);
  const int32_t n_all =
      llama_tokenize(llama_model_get_vocab(model), text.data(), static_cast<int32_t>(text.size()),
                     all.data(), static_cast<int32_t>(all.size()), false, false);
  if (n_all <= 0) {
    std::fprintf(stderr, "llamacpp_decode: tokenize failed (%d)\n", n_all);
    return 1;
  }
  all.resize(static_cast<size_t>(n_all));
  std::printf("| engine | context | prefill tok/s | decode tok/s |\n|---|---|---|---|\n");
  for (const int n : contexts) {
    if (n + decode > n_all) {
      std::fprintf(stderr, "llamacpp_decode: the text has %d tokens, fewer than %d\n", n_all,
                   n + decode);
      return 1;
    }
    Params cp = llama_context_default_params();
    ContextParamsHead head;
    std::memcpy(&head, cp.bytes, sizeof head);
    head.n_ctx = static_cast<uint32_t>(n + decode + 256);
    head.n_batch = head.n_ubatch = static_cast<uint32_t>(n);  // the prompt in one decode
    head.n_seq_max = 1;
    std::memcpy(cp.bytes, &head, sizeof head);
    if (fa != "auto") {
      int32_t enums[4];  // rope scaling, pooling, attention type, flash attention: -1 by default
      std::memcpy(enums, cp.bytes + kFlashAttnOffset - 12, sizeof enums);
      if (enums[0] != -1 || enums[1] != -1 || enums[2] != -1 || enums[3] != -1) {
        std::fprintf(stderr, "llamacpp_decode: unknown llama_context_params layout\n");
        return 1;
      }
      const int32_t v = fa == "on" ? 1 : 0;
      std::memcpy(cp.bytes + kFlashAttnOffset, &v, sizeof v);
    }
    llama_context* ctx = llama_init_from_model(model, cp);
    if (ctx == nullptr || llama_n_ctx(ctx) < head.n_ctx || llama_n_batch(ctx) != head.n_batch) {
      std::fprintf(stderr, "llamacpp_decode: context of %u tokens not created\n", head.n_ctx);
      return 1;
    }
    llama_set_n_threads(ctx, threads, threads);
    if (llama_n_threads(ctx) != threads) {
      std::fprintf(stderr, "llamacpp_decode: %d threads not set\n", threads);
      return 1;
    }
    auto t = std::chrono::steady_clock::now();
    if (llama_decode(ctx, llama_batch_get_one(all.data(), n)) != 0) return 1;
    const double prefill_s = seconds_since(t);
    float sink = 0;
    t = std::chrono::steady_clock::now();
    for (int k = 0; k < decode; ++k) {
      if (llama_decode(ctx, llama_batch_get_one(&all[static_cast<size_t>(n + k)], 1)) != 0)
        return 1;
      sink += llama_get_logits_ith(ctx, -1)[0];
    }
    const double decode_s = seconds_since(t);
    const char* label = fa == "auto" ? "" : fa == "on" ? " fa" : " no-fa";
    std::printf("| llama.cpp%s | %d | %.0f | %.1f |\n", label, n, n / prefill_s, decode / decode_s);
    std::fflush(stdout);
    if (sink != sink) std::fprintf(stderr, "(non-finite logits)\n");
    llama_free(ctx);
  }
  llama_model_free(model);
  return 0;
}
