#!/usr/bin/env bash
# The system packages the test suite needs beyond pip's, installed with Debian's apt-get where
# missing (README.md's test command and .ci/run call this):
#   redis-server        the shared embedding store the fleet tests start
#                       (test/test_embedding_store.py, test/test_fleet.py)
#   chromium            the chat page's browser test (test/test_chat_page.py; it looks for
#                       $SGLANG_TEST_CHROMIUM, else /usr/bin/chromium)
#   fonts-dejavu-core   DejaVu Sans, Mono and Serif, regular and bold
#   fonts-dejavu-extra  the other DejaVu faces, among them the OCR reader's three held-out ones
#                       (benchmark/ocr_render.py renders test/test_ocr_reader.py's questions)
#   fonts-urw-base35, fonts-cantarell, fonts-crosextra-caladea
#                       the second OCR renderer's faces (benchmark/ocr_unseen.py)
# `--check` only says what is missing (exit 1 if anything is). Runs apt-get as root, else
# through sudo; fails, saying what to install, where apt-get is absent or an install fails.
set -euo pipefail

FONT_DIR=/usr/share/fonts/truetype/dejavu
# Every face benchmark/ocr_render.py draws with (all of FONT_DIR but DejaVuMathTeXGyre and
# DejaVuSans-ExtraLight): a set drawn with fewer faces would not be the same set.
CORE_FONTS=(DejaVuSans DejaVuSans-Bold DejaVuSansMono DejaVuSansMono-Bold DejaVuSerif
    DejaVuSerif-Bold)
EXTRA_FONTS=(DejaVuSans-Oblique DejaVuSans-BoldOblique DejaVuSansCondensed
    DejaVuSansCondensed-Bold DejaVuSansCondensed-Oblique DejaVuSansCondensed-BoldOblique
    DejaVuSansMono-Oblique DejaVuSansMono-BoldOblique DejaVuSerif-Italic DejaVuSerif-BoldItalic
    DejaVuSerifCondensed DejaVuSerifCondensed-Bold DejaVuSerifCondensed-Italic
    DejaVuSerifCondensed-BoldItalic)
# One face of each further package the OCR renderers draw with: (package, file)
OTHER_FONTS=(
    "fonts-urw-base35 /usr/share/fonts/opentype/urw-base35/NimbusSans-Regular.otf"
    "fonts-cantarell /usr/share/fonts/opentype/cantarell/Cantarell-Regular.otf"
    "fonts-crosextra-caladea /usr/share/fonts/truetype/crosextra/Caladea-Regular.ttf"
)
CHROMIUM=${SGLANG_TEST_CHROMIUM:-/usr/bin/chromium}

packages=()  # what to install
missing=()   # what was not found, for the messages
check_fonts() {  # check_fonts PACKAGE FACE...: PACKAGE is missing where one of its faces is
    local package=$1 face absent=()
    shift
    for face in "$@"; do
        [ -f "$FONT_DIR/$face.ttf" ] || absent+=("$face.ttf")
    done
    if [ ${#absent[@]} -gt 0 ]; then
        packages+=("$package")
        missing+=("$package: ${absent[*]} not in $FONT_DIR")
    fi
}
find_missing() {
    packages=()
    missing=()
    if ! command -v redis-server >/dev/null; then
        packages+=(redis-server)
        missing+=("redis-server: not on PATH")
    fi
    if ! command -v "$CHROMIUM" >/dev/null; then
        packages+=(chromium)
        missing+=("chromium: no $CHROMIUM")
    fi
    check_fonts fonts-dejavu-core "${CORE_FONTS[@]}"
    check_fonts fonts-dejavu-extra "${EXTRA_FONTS[@]}"
    local entry
    for entry in "${OTHER_FONTS[@]}"; do
        if [ ! -f "${entry#* }" ]; then
            packages+=("${entry%% *}")
            missing+=("${entry%% *}: no ${entry#* }")
        fi
    done
}

say_missing() {
    local item
    for item in "${missing[@]}"; do
        echo "  $item" >&2
    done
}

find_missing
if [ ${#packages[@]} -eq 0 ]; then
    echo "test dependencies present: redis-server, $CHROMIUM, the OCR fonts"
    exit 0
fi
if [ "${1:-}" = --check ]; then
    echo "missing test dependencies (Debian packages ${packages[*]}):" >&2
    say_missing
    exit 1
fi
if ! command -v apt-get >/dev/null; then
    echo "install_test_deps.sh: no apt-get here (not Debian or Ubuntu); install these yourself" \
        "(a Chromium elsewhere: set SGLANG_TEST_CHROMIUM to it):" >&2
    say_missing
    exit 1
fi
sudo=()
if [ "$(id -u)" != 0 ]; then
    if ! command -v sudo >/dev/null; then
        echo "install_test_deps.sh: not root and no sudo: as root, run" \
            "apt-get install ${packages[*]}" >&2
        exit 1
    fi
    sudo=(sudo)
fi
echo "installing with apt-get: ${packages[*]}"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! "${sudo[@]}" apt-get update -qq >"$log" 2>&1; then
    tail -n 20 "$log" >&2
    echo "install_test_deps.sh: apt-get update failed (above); nothing installed" >&2
    exit 1
fi
if ! "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends "${packages[@]}" >"$log" 2>&1; then
    tail -n 20 "$log" >&2
    echo "install_test_deps.sh: apt-get install ${packages[*]} failed (above)" >&2
    exit 1
fi
find_missing
if [ ${#packages[@]} -ne 0 ]; then
    echo "install_test_deps.sh: installed, yet still missing:" >&2
    say_missing
    exit 1
fi
echo "test dependencies installed: redis-server, $CHROMIUM, the OCR fonts"
