#pragma once
// The commit the binary was built from: `git describe --always --dirty` of the source tree when
// it was built (cmake/BuildInfo.cmake runs at every build), "unknown" without git. Result stamps
// name it, and `hlem eval` refuses to reuse cached runs when it differs from the checkout's.

namespace hlem {

const char* BuildCommit();

}  // namespace hlem
