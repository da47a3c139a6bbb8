#!/usr/bin/env bash
# The installed C++ package (docs/cpp.md): `cmake --install` of a build's dev component into a
# fresh prefix; the example project (examples/cpp) found it with find_package(fusebox), built
# against it and run; its output names the version and the logits' shape. A version the
# package is not compatible with is refused by find_package.
#   check_package.sh BUILD_DIR SOURCE_DIR VERSION
set -euo pipefail
build=$1 src=$2 version=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" --component dev > "$tmp/install.log"
for f in include/fusebox/version.h include/fusebox/runtime/executable.h \
         lib/cmake/fusebox/fusebox-config.cmake lib/cmake/fusebox/fusebox-config-version.cmake; do
  [ -f "$tmp/prefix/$f" ] || { echo "not installed: $f"; exit 1; }
done
ls "$tmp"/prefix/lib/libfusebox.so* > /dev/null
configure() {  # build dir, extra args
  cmake -S "$src/examples/cpp" -B "$1" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_PREFIX_PATH="$tmp/prefix" "${@:2}"
}
configure "$tmp/example" > "$tmp/configure.log" || { cat "$tmp/configure.log"; exit 1; }
cmake --build "$tmp/example" > "$tmp/build.log" || { cat "$tmp/build.log"; exit 1; }
out=$("$tmp/example/fusebox_example")
echo "$out"
case $out in
  "fusebox $version: logits [2, 10], sum "*) ;;
  *) echo "unexpected output (want 'fusebox $version: logits [2, 10], sum ...')"; exit 1 ;;
esac
# find_package(fusebox 99.0) must fail: the package config checks the version.
sed 's/find_package(fusebox 0.1 /find_package(fusebox 99.0 /' "$src/examples/cpp/CMakeLists.txt" \
  > "$tmp/CMakeLists.txt"
mkdir -p "$tmp/newer" && cp "$tmp/CMakeLists.txt" "$src/examples/cpp/main.cpp" "$tmp/newer/"
if cmake -S "$tmp/newer" -B "$tmp/newer/build" -G Ninja -DCMAKE_PREFIX_PATH="$tmp/prefix" \
     > "$tmp/newer.log" 2>&1; then
  echo "find_package(fusebox 99.0) succeeded against $version"; exit 1
fi
grep -q "version" "$tmp/newer.log" || { cat "$tmp/newer.log"; exit 1; }
echo "package ok"
