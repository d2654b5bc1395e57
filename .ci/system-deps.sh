#!/usr/bin/env bash
# Debian packages the suite needs: chromium (plotly static export, browser tests),
# fonts-noto-cjk (Chinese tokens in figures), the default corpus and the tiny LM's training text (see below).
# Installed only when missing and when we can.
set -euo pipefail
missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
fc-list 2>/dev/null | grep -qi "Noto Sans CJK" || missing+=(fonts-noto-cjk)
# default corpus of `engram-viz corpus`: the KJV (public domain text; `bible` program GPL-2+)
# and the Chinese Debian Reference (GPL-2+)
{ command -v bible >/dev/null 2>&1 && [ -f /usr/lib/bible.data ]; } || missing+=(bible-kjv bible-kjv-text)
[ -f /usr/share/debian-reference/debian-reference.zh-cn.txt.gz ] || missing+=(debian-reference-zh-cn)
# the tiny LM's training text adds WordNet 3.0 noun glosses (wordnet-base, WordNet 3.0 licence,
# permissive) and Chinese sayings and poems (fortunes-zh, GPL-3+); see engram_viz/tiny/sources.py
[ -f /usr/share/wordnet/data.noun ] || missing+=(wordnet-base)
[ -f /usr/share/games/fortunes/tang300 ] || missing+=(fortunes-zh)
[ ${#missing[@]} -eq 0 ] && exit 0
if ! command -v apt-get >/dev/null 2>&1; then
  echo "system-deps: apt-get not found; install ${missing[*]} yourself (tests that need them skip)" >&2
  exit 0
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  # never a password prompt: sudo only when it works without one
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo="sudo -n"
  else
    echo "system-deps: not root, skipped: ${missing[*]} (as root: apt-get install ${missing[*]}; tests that need them skip)" >&2
    exit 0
  fi
fi
echo "system-deps: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" fontconfig >/dev/null
