# Sourced by the GPU session's scripts: Criterion and cJSON carried to the
# device as .deb files in .devdeps/ (../shared/device/README.md), unpacked
# under /opt/deps (never into /) and put on the compiler's and loader's paths;
# nvcc on PATH. Run from the repository root; does nothing without .devdeps,
# and unpacks only once for a script and the scripts it starts.
if [ -z "${VELA_DEVDEPS:-}" ] && [ -d .devdeps ] && ls .devdeps/*.deb >/dev/null 2>&1; then
  mkdir -p /opt/deps && for f in .devdeps/*.deb; do dpkg -x "$f" /opt/deps; done
  export VELA_DEVDEPS=/opt/deps
  L=/opt/deps/usr/lib/x86_64-linux-gnu
  # The packages' .pc files name /usr (libcjson.pc: includedir=/usr/include,
  # Cflags -I${includedir}/cjson), where nothing was installed: point them at
  # /opt/deps, or CMake refuses the imported target's missing include path.
  sed -i -E 's#=/usr(/|$)#=/opt/deps/usr\1#' "$L"/pkgconfig/*.pc
  export CMAKE_PREFIX_PATH=/opt/deps/usr PKG_CONFIG_PATH=$L/pkgconfig
  export LD_LIBRARY_PATH=$L:${LD_LIBRARY_PATH:-} LDFLAGS="-Wl,-rpath-link,$L"
  export CPATH=/opt/deps/usr/include:${CPATH:-} LIBRARY_PATH=$L:${LIBRARY_PATH:-}
fi
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
