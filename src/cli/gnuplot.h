#pragma once
// Pictures with gnuplot: the script goes in, PNG bytes come out of its standard output,
// so that push train writes (and checks) the file itself.
#include <optional>
#include <string>

namespace push::cli {

/// Renders `script` (after a pngcairo preamble) and returns the PNG, or nothing with a
/// warning on stderr when gnuplot is missing or does not produce a complete PNG.
/// `name` is the picture's name in the warning. Inline data: `$data << EOD ... EOD`.
std::optional<std::string> render_png(const std::string& name, const std::string& script);

}  // namespace push::cli
