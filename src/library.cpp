// libfusebox (src/CMakeLists.txt: fusebox_library) is the layers' archives linked whole; a
// shared library target needs a source of its own, and this is it. The version it was built at,
// for a program to compare with the headers' (fusebox/version.h).
#include "fusebox/version.h"

namespace fusebox {

extern const char* const kLibraryVersion = FUSEBOX_VERSION_STRING;

}  // namespace fusebox
