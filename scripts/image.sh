#!/usr/bin/env bash
# Builds warren's container image with podman, without any registry: the root file system is
# laid out here from a release binary (built from source unless --binary names one) and the
# Containerfile at the repository's root copies it onto an empty image (see its header).
#
#   scripts/image.sh                                  cargo build --release, then the image
#   scripts/image.sh --binary target/release/warren   reuse a built binary (as CI does)
#   scripts/image.sh --tag warren:dev                 the tag [default: localhost/warren:latest]
#   scripts/image.sh --save warren.tar                also write it as a tar (podman/docker load)
#
# Installs what it needs with apt-get (podman, busybox-static, binutils) when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
binary=""
tag="localhost/warren:latest"
save=""
while [ $# -gt 0 ]; do
  case "$1" in
    --binary) binary="$2"; shift 2 ;;
    --tag) tag="$2"; shift 2 ;;
    --save) save="$2"; shift 2 ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "image.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
done

need=()
command -v podman >/dev/null || need+=(podman)
command -v runc >/dev/null || need+=(runc)
[ -x /bin/busybox ] || need+=(busybox-static)
command -v objcopy >/dev/null || need+=(binutils)
if [ ${#need[@]} -gt 0 ]; then
  echo "image.sh: installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
# Here podman runs with runc and cgroupfs: crun refuses this kernel's hybrid cgroups.
podman() { command podman --runtime runc --cgroup-manager=cgroupfs "$@"; }

# busybox (the Debian package busybox, not busybox-static, is dynamically linked): the image
# has no libraries but warren's, so the shell must be the static build.
if ! file -L /bin/busybox 2>/dev/null | grep -q "statically linked" \
    && ! ldd /bin/busybox 2>&1 | grep -q "not a dynamic executable"; then
  echo "image.sh: /bin/busybox is not statically linked: apt-get install busybox-static" >&2
  exit 1
fi

if [ -z "$binary" ]; then
  cargo build --release -p warren
  binary=target/release/warren
fi
[ -x "$binary" ] || { echo "image.sh: no executable at $binary" >&2; exit 1; }

context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
root="$context/rootfs"
mkdir -p "$root/usr/local/bin" "$root/bin" "$root/etc" "$context/data"
install -d -m 1777 "$root/tmp"
# Debug info is half the binary and of no use without the sources beside it.
objcopy --strip-debug "$binary" "$root/usr/local/bin/warren"
install -m 755 deploy/container/warren-entrypoint "$root/usr/local/bin/warren-entrypoint"

# The shared libraries and the dynamic loader, at the paths the binary asks for them.
ldd "$binary" | awk '/=> \// { print $3 } /^\t\/[^ ]+ \(/ { print $1 }' | while read -r lib; do
  mkdir -p "$root$(dirname "$lib")"
  cp -L "$lib" "$root$lib"
done
if [ ! -e "$root/lib64/ld-linux-x86-64.so.2" ] && [ "$(uname -m)" = x86_64 ]; then
  echo "image.sh: ldd named no dynamic loader for $binary" >&2
  exit 1
fi

cp /bin/busybox "$root/bin/busybox"
for applet in sh ls cat cp mv rm mkdir df du ps env sleep tar hostname id grep; do
  ln -s busybox "$root/bin/$applet"
done

cat > "$root/etc/passwd" <<'PASSWD'
root:x:0:0:root:/root:/bin/sh
warren:x:999:999:warren:/var/lib/warren:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
PASSWD
cat > "$root/etc/group" <<'GROUP'
root:x:0:
warren:x:999:
nogroup:x:65534:
GROUP
cat > "$root/etc/nsswitch.conf" <<'NSS'
passwd: files
group: files
hosts: files dns
NSS

podman build --quiet -f Containerfile -t "$tag" "$context" >/dev/null
echo "image.sh: built $tag ($(podman image inspect "$tag" --format '{{.Size}}' | awk '{ printf "%.1f MB", $1 / 1e6 }'))"
if [ -n "$save" ]; then
  podman save -o "$save" "$tag"
  echo "image.sh: saved $tag to $save"
fi
