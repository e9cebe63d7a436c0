// Public contract of libtern_tls: every export carries the TernTls_ prefix,
// sizes and results are int32_t, and nothing here aborts the process.
#pragma once

#include <stdint.h>

#if defined(__GNUC__)
#define TERN_EXPORT __attribute__((visibility("default")))
#else
#define TERN_EXPORT
#endif

// Version of this library's ABI. The managed side refuses to run against a
// library whose ABI differs from the one it was built for.
#define TERN_TLS_ABI_VERSION 1

// Returns TERN_TLS_ABI_VERSION.
TERN_EXPORT int32_t TernTls_AbiVersion(void);

// Returns OpenSSL's runtime version number (OPENSSL_VERSION_NUMBER layout,
// 0xMNN00PP0L) so the caller can refuse a library older than 3.0.
TERN_EXPORT int64_t TernTls_OpenSslVersionNumber(void);

// Copies OpenSSL's runtime version text ("OpenSSL 3.0.19 27 Jan 2026") into
// buffer, NUL-terminated and truncated to capacity. Returns the full length of
// the text (excluding NUL), or -1 if buffer is NULL or capacity < 1.
TERN_EXPORT int32_t TernTls_OpenSslVersionText(char* buffer, int32_t capacity);
