#!/bin/sh
# The installed copy of libloom is enough for an embedder: installs this
# build into a temporary prefix (cmake --install), checks what was
# installed (the loom command, both libraries, every public header, the
# .pc files), that each installed header compiles alone in C11 and C++20
# and that loom.h includes them all, then builds examples/embed.c from a
# copy outside the tree with exactly
#
#   cc embed.c $(pkg-config --cflags --libs loom)
#
# (PKG_CONFIG_PATH pointing at the prefix only adds loom's .pc files),
# runs it (tests/install/check_embed.sh) and links a program against
# loom-server. Run by CTest (install_embed) with LOOM_SOURCE_DIR,
# LOOM_BUILD_DIR, LOOM_TEST_TMP, CMAKE and CC set; prints "install: ok"
# or what went wrong, and exits 0 or 1.
set -u
src=${LOOM_SOURCE_DIR:?}
build=${LOOM_BUILD_DIR:?}
cmake=${CMAKE:-cmake}
cc=${CC:-cc}
cxx=${CXX:-c++}
work=${LOOM_TEST_TMP:?}/install
prefix=$work/prefix
fail() {
    echo "install: $*"
    exit 1
}
rm -rf "$work"
mkdir -p "$work/src" || fail "cannot make $work"

"$cmake" --install "$build" --prefix "$prefix" >"$work/install.log" 2>&1 ||
    { cat "$work/install.log"; fail "cmake --install failed"; }

# ---- what was installed ---------------------------------------------------
[ -x "$prefix/bin/loom" ] || fail "no bin/loom"
"$prefix/bin/loom" --version | grep -q '^loom [0-9]' ||
    fail "bin/loom --version does not say its version"
pc=$(find "$prefix" -name loom.pc)
[ -n "$pc" ] || fail "no loom.pc"
libdir=$(dirname "$(dirname "$pc")")
[ -f "$libdir/libloom.a" ] || fail "no libloom.a beside $pc"
[ -f "$libdir/libloom-server.a" ] || fail "no libloom-server.a beside $pc"
[ -f "$(dirname "$pc")/loom-server.pc" ] || fail "no loom-server.pc"
inc=$prefix/include
[ -f "$inc/loom.h" ] || fail "no include/loom.h"
(cd "$src/include/loom" && ls ./*.h) >"$work/want"
(cd "$inc/loom" && ls ./*.h) >"$work/have"
cmp -s "$work/want" "$work/have" ||
    { diff "$work/want" "$work/have"; fail "installed headers differ"; }
# loom.h includes every public header.
sed -n 's|^#include "loom/\(.*\)"$|./\1|p' "$inc/loom.h" | sort >"$work/umbrella"
cmp -s "$work/want" "$work/umbrella" ||
    { diff "$work/want" "$work/umbrella"; fail "loom.h misses a header"; }

PKG_CONFIG_PATH=$(dirname "$pc")
export PKG_CONFIG_PATH
cflags=$(pkg-config --cflags loom) || fail "pkg-config --cflags loom failed"
# loom.pc's paths are relative to its place (${pcfiledir}/../..): compare
# the folders the -I flags name, not their spelling.
real() { (cd "$1" 2>/dev/null && pwd -P); }
found=0
for f in $cflags; do
    case $f in
    -I*)
        d=$(real "${f#-I}")
        [ "$d" = "$(real "$inc")" ] && found=1
        [ "$d" = "$(real "$src/include")" ] &&
            fail "pkg-config --cflags loom points into the tree: $cflags"
        ;;
    esac
done
[ "$found" = 1 ] || fail "pkg-config --cflags loom has no -I$inc: $cflags"

# ---- each header alone, in C and in C++ ----------------------------------
cxx_ok=1
command -v "$cxx" >/dev/null 2>&1 || {
    cxx_ok=0
    echo "install: no C++ compiler ($cxx): C++ header checks skipped"
}
for h in loom.h $(cd "$inc" && ls loom/*.h); do
    printf '#include <%s>\nint main(void) { return 0; }\n' "$h" >"$work/src/h.c"
    # shellcheck disable=SC2086
    "$cc" -std=c11 -Wall -Wextra -Werror -pedantic -fsyntax-only $cflags \
        "$work/src/h.c" || fail "$h does not compile alone in C11"
    [ "$cxx_ok" = 1 ] || continue
    cp "$work/src/h.c" "$work/src/h.cpp"
    # shellcheck disable=SC2086
    "$cxx" -std=c++20 -Wall -Wextra -Werror -fsyntax-only $cflags \
        "$work/src/h.cpp" || fail "$h does not compile alone in C++20"
done

# ---- the example, from a copy outside the tree ---------------------------
cp "$src/examples/embed.c" "$work/src/embed.c" || fail "no examples/embed.c"
# shellcheck disable=SC2046
(cd "$work/src" &&
    "$cc" embed.c $(pkg-config --cflags --libs loom) -o embed) ||
    fail "embed.c does not build against the installed copy"
sh "$src/tests/install/check_embed.sh" "$work/src/embed" "$work/embed.db" ||
    fail "the example built against the installed copy failed"

# ---- the server library ---------------------------------------------------
cat >"$work/src/server.c" <<'EOC'
#include <loom.h>
/* loom_server_new refuses missing options: linked and called. */
int main(void)
{
    loom_server *srv = NULL;
    return loom_server_new(&srv, NULL) == LOOM_EINVALID && !srv ? 0 : 1;
}
EOC
# shellcheck disable=SC2046
(cd "$work/src" &&
    "$cc" server.c $(pkg-config --cflags --libs loom-server) -o server) ||
    fail "a program does not link with pkg-config loom-server"
"$work/src/server" || fail "loom_server_new did not refuse NULL options"

rm -rf "$work"
echo "install: ok"
