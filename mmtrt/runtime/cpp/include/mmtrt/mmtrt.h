/* The C API of the mmtrt runtime: opaque handles and status codes over mmtrt::Bundle, for other languages.
 * Every function returns MMTRT_OK or an error code; mmtrt_last_error() then holds the one-line message
 * (per thread, valid until the next call on that thread). No function throws or aborts. */
#ifndef MMTRT_MMTRT_H
#define MMTRT_MMTRT_H

#include <stddef.h>
#include <stdint.h>

#if defined(MMTRT_BUILDING)
#define MMTRT_C_API __attribute__((visibility("default")))
#else
#define MMTRT_C_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mmtrt_status {
  MMTRT_OK = 0,
  MMTRT_ERR_ARGUMENT = 1,   /* a null handle or pointer, a buffer too small */
  MMTRT_ERR_BUNDLE = 2,     /* missing bundle, bad manifest, tampered artifact */
  MMTRT_ERR_INPUT = 3,      /* unreadable image, image or prompt outside the bundle's envelope */
  MMTRT_ERR_RUNTIME = 4     /* ONNX Runtime, the tokenizer or the system failed */
} mmtrt_status;

typedef struct mmtrt_bundle mmtrt_bundle;
typedef struct mmtrt_generation mmtrt_generation;

MMTRT_C_API const char* mmtrt_last_error(void);

/* threads: ONNX Runtime intra-op threads (0: its default); spin: 0 or 1. */
MMTRT_C_API mmtrt_status mmtrt_bundle_load(const char* path, int threads, int spin, mmtrt_bundle** out);
/* The same, refusing the bundle (MMTRT_ERR_BUNDLE) unless its digest is expect_digest ("sha256:HEX") and it
 * carries a valid signature by the PEM public_key (`mmtrt sign`); either may be NULL. */
MMTRT_C_API mmtrt_status mmtrt_bundle_load_trusted(const char* path, int threads, int spin, const char* expect_digest,
                                                   const char* public_key, mmtrt_bundle** out);
/* The same with flags: MMTRT_PARSE_SPECIAL_TOKENS makes special tokens typed in a prompt act as such (by default
 * they are text, so a prompt cannot forge a turn or a second image); other bits are MMTRT_ERR_ARGUMENT. */
#define MMTRT_PARSE_SPECIAL_TOKENS 1u
MMTRT_C_API mmtrt_status mmtrt_bundle_load_with(const char* path, int threads, int spin, const char* expect_digest,
                                                const char* public_key, unsigned flags, mmtrt_bundle** out);
MMTRT_C_API void mmtrt_bundle_free(mmtrt_bundle* bundle);

/* max_new_tokens <= 0: the bundle's envelope.max_new_tokens. */
MMTRT_C_API mmtrt_status mmtrt_generate(mmtrt_bundle* bundle, const char* image_path, const char* prompt,
                                        int max_new_tokens, int raw_prompt, mmtrt_generation** out);
MMTRT_C_API void mmtrt_generation_free(mmtrt_generation* generation);
MMTRT_C_API const char* mmtrt_generation_text(const mmtrt_generation* generation);
MMTRT_C_API size_t mmtrt_generation_token_count(const mmtrt_generation* generation);
MMTRT_C_API const int32_t* mmtrt_generation_tokens(const mmtrt_generation* generation);
MMTRT_C_API const char* mmtrt_generation_json(const mmtrt_generation* generation);

/* Sampling parameters with the names and ranges of mmtrt.runtime.sampling.SamplingParams; a new one is greedy
 * (temperature 0) with the bundle's max_new_tokens. A value outside its range is MMTRT_ERR_INPUT and leaves the
 * parameter as it was; an unknown name is MMTRT_ERR_ARGUMENT. The same seed gives the Python runtime's tokens. */
typedef struct mmtrt_sampling mmtrt_sampling;
MMTRT_C_API mmtrt_status mmtrt_sampling_create(mmtrt_sampling** out);
MMTRT_C_API void mmtrt_sampling_free(mmtrt_sampling* sampling);
/* name: "temperature", "top_p" or "repetition_penalty" */
MMTRT_C_API mmtrt_status mmtrt_sampling_set_float(mmtrt_sampling* sampling, const char* name, double value);
/* name: "top_k" (0 or -1: off) or "max_new_tokens" */
MMTRT_C_API mmtrt_status mmtrt_sampling_set_int(mmtrt_sampling* sampling, const char* name, int64_t value);
MMTRT_C_API mmtrt_status mmtrt_sampling_set_seed(mmtrt_sampling* sampling, uint64_t seed);
/* The text ends before the first stop string found (repeat to add more). */
MMTRT_C_API mmtrt_status mmtrt_sampling_add_stop(mmtrt_sampling* sampling, const char* stop);
MMTRT_C_API mmtrt_status mmtrt_generate_sampled(mmtrt_bundle* bundle, const char* image_path, const char* prompt,
                                                int raw_prompt, const mmtrt_sampling* sampling,
                                                mmtrt_generation** out);

/* One sequence's sampler, for a decoding loop of the caller's own: choose reads one position's logits [vocab]. */
typedef struct mmtrt_sampler mmtrt_sampler;
MMTRT_C_API mmtrt_status mmtrt_sampler_create(const mmtrt_sampling* sampling, const int32_t* prompt_ids,
                                              size_t count, size_t vocab, mmtrt_sampler** out);
MMTRT_C_API mmtrt_status mmtrt_sampler_choose(mmtrt_sampler* sampler, const float* logits, int32_t* token);
MMTRT_C_API void mmtrt_sampler_free(mmtrt_sampler* sampler);

/* The steps of generate. Sizes in elements; *count is set even when capacity is too small (then
 * MMTRT_ERR_ARGUMENT), so a caller can ask with capacity 0 first. */
MMTRT_C_API mmtrt_status mmtrt_prompt_ids(const mmtrt_bundle* bundle, const char* prompt, int raw_prompt,
                                          int32_t* ids, size_t capacity, size_t* count);
MMTRT_C_API mmtrt_status mmtrt_pixel_values(const mmtrt_bundle* bundle, const char* image_path, float* values,
                                            size_t capacity, size_t* count);
/* Writes a NUL-terminated string; *length excludes the NUL. */
MMTRT_C_API mmtrt_status mmtrt_decode(const mmtrt_bundle* bundle, const int32_t* ids, size_t count, char* text,
                                      size_t capacity, size_t* length);

#ifdef __cplusplus
}
#endif
#endif
