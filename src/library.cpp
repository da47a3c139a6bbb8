// libfusebox (src/CMakeLists.txt: fusebox_library) is the layers' archives linked whole; a shared
// library target needs a source of its own, and this is it: it defines nothing.
