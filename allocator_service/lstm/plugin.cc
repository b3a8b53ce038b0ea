// The LSTM baseline as a plugin (libhlem_lstm.so): the binaries load it with dlopen only when the
// lstm controller is asked for, so that they do not link libtorch (its static initialisers cost
// every start of `hlem` or `allocator` ≈ 1.7 s on our VM). The ABI is this one function; the
// caller and the plugin are built from one tree by one compiler (allocator_service/core/
// registry.cc checks the plugin's version string).

#include <string>

#include "allocator_service/lstm/lstm_controller.h"

extern "C" {

const char* hlem_lstm_plugin_version() { return HLEM_LSTM_PLUGIN_VERSION; }

// A new LSTM controller (owned by the caller), or null with *error set.
hlem::allocator::Controller* hlem_make_lstm_controller(const hlem::allocator::LstmOptions* options,
                                                       std::string* error) {
  absl::StatusOr<std::unique_ptr<hlem::allocator::Controller>> c =
      hlem::allocator::MakeLstm(*options);
  if (!c.ok()) {
    *error = std::string(c.status().message());
    return nullptr;
  }
  return c->release();
}
}
