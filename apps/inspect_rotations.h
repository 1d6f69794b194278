// `oscar inspect` for rotation files: oscar's own safetensors file (its provenance metadata and a
// validation against its own sizes) and the release's torch `.pt` files (read with the restricted
// reader: version, objective, layers, tensor shapes). Both print to stdout and return the exit
// status.
#pragma once

#include <string>

namespace oscar::apps {

int inspect_rotation_file(const std::string& path);  // *.safetensors with format oscar-rotations
int inspect_torch_file(const std::string& path);     // *.pt
// One line of provenance for DIR/oscar_rotations.safetensors, or nothing when it is absent.
void print_default_rotations_line(const std::string& model_dir);

}  // namespace oscar::apps
