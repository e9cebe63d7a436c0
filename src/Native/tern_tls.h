// Public contract of libtern_tls: every export carries the TernTls_ prefix,
// sizes and results are int32_t, and nothing here aborts the process.
//
// Memory windows: each operation takes the caller's input and output spans,
// arms them on the connection's BIO for the duration of the call only, and
// clears them before returning. No pointer the caller passes is kept.
#pragma once

#include <stdint.h>

#if defined(__GNUC__)
#define TERN_EXPORT __attribute__((visibility("default")))
#else
#define TERN_EXPORT
#endif

#ifdef __cplusplus
extern "C" {
#endif

// Version of this library's ABI. The managed side refuses to run against a
// library whose ABI differs from the one it was built for.
#define TERN_TLS_ABI_VERSION 5

// Results of every operation (TernTlsResult.status, or a negative return).
enum
{
    TERN_TLS_OK = 0,            // done; for decrypt, more plaintext may follow (call again)
    TERN_TLS_WANT_READ = 1,     // needs more ciphertext input
    TERN_TLS_CLOSED = 2,        // peer sent close_notify
    TERN_TLS_OUTPUT_FULL = 3,   // output window is full; call again with a new one
    TERN_TLS_ERROR = -1,        // TLS failure (bad record, alert, handshake failure); see TernTls_ConnectionError
    TERN_TLS_BAD_ARGUMENT = -2, // a pointer or length was invalid
    TERN_TLS_NO_MEMORY = -3,
};

// What one operation did. Layout shared with the managed side.
typedef struct TernTlsResult
{
    int32_t status;   // one of the TERN_TLS_* values
    int32_t consumed; // bytes taken from the input (ciphertext, or plaintext for encrypt)
    int32_t produced; // bytes written into the output window
    int32_t spilled;  // bytes of output that did not fit and went to the spill buffer during this call
    int32_t pending;  // bytes waiting in the spill buffer after this call (to be drained into the transport)
    int32_t drained;  // bytes of produced that came out of the spill buffer (the rest went straight in)
} TernTlsResult;

typedef struct TernTlsServer TernTlsServer;
typedef struct TernTlsConnection TernTlsConnection;

// Picks the certificate for a ClientHello's server name (NULL when the client
// sent none). Returns an index from TernTls_ServerAddCertificate, or -1 for the
// first certificate. Called during TernTls_Handshake, on the caller's thread.
typedef int32_t (*TernTlsCertificateSelector)(void* state, const char* serverName, int32_t length);

TERN_EXPORT int32_t TernTls_AbiVersion(void);

// OpenSSL's runtime version number (0xMNN00PP0L); the caller refuses < 3.0.
TERN_EXPORT int64_t TernTls_OpenSslVersionNumber(void);

// Copies OpenSSL's version text into buffer (NUL-terminated, truncated to
// capacity). Returns the full length, or -1 if buffer is NULL or capacity < 1.
TERN_EXPORT int32_t TernTls_OpenSslVersionText(char* buffer, int32_t capacity);

// Copies and clears the text of the calling thread's OpenSSL error queue
// (for failures of the Server calls). Returns the length written.
TERN_EXPORT int32_t TernTls_LastErrorText(char* buffer, int32_t capacity);

// Creates a server: TLS 1.2 and 1.3 only, AEAD ciphers, session tickets.
// alpn is the endpoint's protocols in wire format and preference order
// ("\x02h2\x08http/1.1"); selector/state choose the certificate per SNI.
TERN_EXPORT int32_t TernTls_ServerCreate(const uint8_t* alpn, int32_t alpnLength,
                                         TernTlsCertificateSelector selector, void* state,
                                         TernTlsServer** server);

// Adds a certificate (PEM: leaf then intermediates) and its PEM private key.
// Returns its index (>= 0) or TERN_TLS_ERROR (see TernTls_LastErrorText).
TERN_EXPORT int32_t TernTls_ServerAddCertificate(TernTlsServer* server,
                                                 const uint8_t* certificatePem, int32_t certificateLength,
                                                 const uint8_t* keyPem, int32_t keyLength);

// Sets session-ticket keys shared by replicas: count keys of 80 bytes each
// (16 name, 32 AES-256 key, 32 HMAC-SHA256 key); the first one encrypts new
// tickets, all of them decrypt. Without this, each server has random keys.
// Call before the first connection: handshakes read the keys without a lock.
TERN_EXPORT int32_t TernTls_ServerSetTicketKeys(TernTlsServer* server, const uint8_t* keys, int32_t length);

// Client certificates (mTLS) asked for by TernTls_ServerSetClientCertificates.
enum
{
    TERN_TLS_CLIENT_CERTIFICATES_NONE = 0,     // not asked for
    TERN_TLS_CLIENT_CERTIFICATES_OPTIONAL = 1, // asked for; a client without one carries on
    TERN_TLS_CLIENT_CERTIFICATES_REQUIRED = 2, // a client without one fails the handshake
};

// Asks clients for a certificate that must chain to one of the PEM CA
// certificates in caPem (their names are sent in the CertificateRequest) and
// be valid for client authentication; an untrusted certificate fails the
// handshake in both modes. Sessions resume only under the same mode and CAs.
// Call after the last TernTls_ServerAddCertificate, before the first connection.
TERN_EXPORT int32_t TernTls_ServerSetClientCertificates(TernTlsServer* server, int32_t mode,
                                                        const uint8_t* caPem, int32_t caLength);

// Drops the caller's reference; connections hold their own.
TERN_EXPORT void TernTls_ServerRelease(TernTlsServer* server);

// Creates a server-side connection on server (which must have a certificate).
TERN_EXPORT int32_t TernTls_ConnectionCreate(TernTlsServer* server, TernTlsConnection** connection);

TERN_EXPORT void TernTls_ConnectionFree(TernTlsConnection* connection);

// Advances the handshake with input ciphertext; handshake records go to output
// (and to the spill buffer when output is full). status: OK when complete,
// WANT_READ when more input is needed, ERROR on failure.
TERN_EXPORT int32_t TernTls_Handshake(TernTlsConnection* connection,
                                      const uint8_t* input, int32_t inputLength,
                                      uint8_t* output, int32_t outputLength,
                                      TernTlsResult* result);

// Decrypts input ciphertext into output (outputLength > 0), as many records as fit. status: OK
// when output filled up (call again: more may follow), WANT_READ when all
// input is used, CLOSED on close_notify, ERROR on a bad record or alert.
// Bytes OpenSSL writes meanwhile (alerts, KeyUpdate replies) go to the spill
// buffer; result.pending tells the caller to drain it into the transport.
// ERROR, before reading anything, when more than TERN_TLS_UNREAD_ANSWERS_LIMIT
// bytes of such answers wait there: the peer provokes them without reading.
#define TERN_TLS_UNREAD_ANSWERS_LIMIT (64 * 1024)
TERN_EXPORT int32_t TernTls_Decrypt(TernTlsConnection* connection,
                                    const uint8_t* input, int32_t inputLength,
                                    uint8_t* output, int32_t outputLength,
                                    TernTlsResult* result);

// Drains the spill buffer into output first; then, only if it is empty,
// encrypts input into records written to output. A record larger than what is
// left of output is written across windows: status OUTPUT_FULL with consumed 0
// then means "call again with a new window and the same input", and Decrypt and
// Shutdown return BAD_ARGUMENT until that record is out. consumed is the
// plaintext taken once its records are fully out. status: OK, or OUTPUT_FULL
// (spill remains, a record continues in the next window, or input came with an
// empty window).
TERN_EXPORT int32_t TernTls_Encrypt(TernTlsConnection* connection,
                                    const uint8_t* input, int32_t inputLength,
                                    uint8_t* output, int32_t outputLength,
                                    TernTlsResult* result);

// Queues close_notify and drains what fits into output.
TERN_EXPORT int32_t TernTls_Shutdown(TernTlsConnection* connection,
                                     uint8_t* output, int32_t outputLength,
                                     TernTlsResult* result);

// Negotiated parameters, valid after the handshake completed.
// protocol: 0x0303 (TLS 1.2) or 0x0304 (TLS 1.3); resumed: 0 or 1.
TERN_EXPORT int32_t TernTls_ConnectionProtocol(TernTlsConnection* connection);
TERN_EXPORT int32_t TernTls_ConnectionResumed(TernTlsConnection* connection);
// Copies the IANA/OpenSSL cipher name, the ALPN protocol and the SNI name;
// each returns the length (0 when absent).
TERN_EXPORT int32_t TernTls_ConnectionCipher(TernTlsConnection* connection, char* buffer, int32_t capacity);
TERN_EXPORT int32_t TernTls_ConnectionAlpn(TernTlsConnection* connection, char* buffer, int32_t capacity);
TERN_EXPORT int32_t TernTls_ConnectionServerName(TernTlsConnection* connection, char* buffer, int32_t capacity);

// Copies the client's verified certificate (DER) into buffer. Returns its
// length, 0 when the client sent none, or the negative length needed when
// buffer is NULL or smaller.
TERN_EXPORT int32_t TernTls_ConnectionPeerCertificate(TernTlsConnection* connection, uint8_t* buffer, int32_t capacity);

// 1 when OpenSSL holds the start of a record whose rest has not arrived: a peer
// that closes now has cut a record short. Ask after Decrypt returned WANT_READ.
TERN_EXPORT int32_t TernTls_ConnectionPartialRecord(TernTlsConnection* connection);

// 1 when the handshake failed because of the client's certificate (none sent
// where one is required, or one that does not verify), else 0.
TERN_EXPORT int32_t TernTls_ConnectionClientCertificateRefused(TernTlsConnection* connection);

// The reason of the last ERROR on this connection (OpenSSL's error text).
TERN_EXPORT int32_t TernTls_ConnectionError(TernTlsConnection* connection, char* buffer, int32_t capacity);

#ifdef __cplusplus
}
#endif
