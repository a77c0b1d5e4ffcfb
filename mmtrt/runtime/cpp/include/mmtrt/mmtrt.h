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
MMTRT_C_API void mmtrt_bundle_free(mmtrt_bundle* bundle);

/* max_new_tokens <= 0: the bundle's envelope.max_new_tokens. */
MMTRT_C_API mmtrt_status mmtrt_generate(mmtrt_bundle* bundle, const char* image_path, const char* prompt,
                                        int max_new_tokens, int raw_prompt, mmtrt_generation** out);
MMTRT_C_API void mmtrt_generation_free(mmtrt_generation* generation);
MMTRT_C_API const char* mmtrt_generation_text(const mmtrt_generation* generation);
MMTRT_C_API size_t mmtrt_generation_token_count(const mmtrt_generation* generation);
MMTRT_C_API const int32_t* mmtrt_generation_tokens(const mmtrt_generation* generation);
MMTRT_C_API const char* mmtrt_generation_json(const mmtrt_generation* generation);

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
