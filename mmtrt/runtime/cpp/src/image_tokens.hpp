// The image's tokens in the prompt. A bundle whose token_prune has `budget: dynamic` gives, beside the padded block
// image_features [1, max, D], image_token_count [1]: the image's own tokens are the block's first count rows, and
// the prompt's placeholder, expanded to the bundle's max (tokens_per_image) as for any bundle, is cut to that
// count (mmtrt.runtime.pipeline's image_features and fit_image_tokens).
#pragma once

#include <cstdint>
#include <vector>

#include "runner.hpp"

namespace mmtrt {

// Under a dynamic budget, cuts the vision outputs' image_features to the image's image_token_count rows and ids'
// run of image_token_id to as many; otherwise leaves both as they are.
void fit_to_image_token_count(Tensors& vision, std::vector<int64_t>& ids, int64_t image_token_id);

}  // namespace mmtrt
