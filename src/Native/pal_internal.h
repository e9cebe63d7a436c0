// Shared between the pal_*.c files; not exported.
#pragma once

#include "tern_tls.h"

#include <openssl/ssl.h>
#include <stddef.h>

// Copies text into buffer (NUL-terminated, truncated); returns the length
// copied, or -1 for a NULL buffer or capacity < 1.
int32_t TernCopyText(const char* text, size_t length, char* buffer, int32_t capacity);

// Moves the thread's OpenSSL error queue into buffer as "reason; reason".
void TernDrainErrors(char* buffer, size_t capacity);

struct TernTlsServer
{
    _Atomic int references;
    SSL_CTX** contexts; // one per certificate; [0] is the default
    int32_t count;
    int32_t capacity;
    uint8_t* alpn;
    int32_t alpnLength;
    TernTlsCertificateSelector selector;
    void* selectorState;
    uint8_t* ticketKeys; // count * 80 bytes
    int32_t ticketKeyCount;
};

void TernServerRetain(TernTlsServer* server);
