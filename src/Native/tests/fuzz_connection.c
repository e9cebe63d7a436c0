// Fuzz target for libtern_tls: one connection between a real OpenSSL client and the library,
// every step chosen by the input. The input is a script, not a TLS stream, so that the fuzzer
// spends its time on the library's own code (the windows, the spill buffer, records written
// across windows, the call contract) rather than on OpenSSL's parsers:
//   - how much ciphertext each call gets and how large each output window is (0 included);
//   - what the client does: writes, KeyUpdates (TLS 1.3), close_notify;
//   - what the server does: encrypts, shuts down, is asked the state queries;
//   - the session: TLS 1.2 or 1.3, a resumed one or not, the client's ALPN offer, a certificate
//     that outgrows the spill buffer, client certificates (none asked, optional, required and
//     trusted, required and from a CA the server does not trust);
//   - tampering with the bytes in flight: a byte flipped, bytes inserted, the stream cut. This
//     also makes malformed ClientHellos and records out of real ones.
// Every buffer handed to the library is allocated at its exact size, so a read or write past a
// window is an AddressSanitizer report. Checked on every call: the counts stay inside the
// windows, the status is the return value, an error has a reason. Checked on the data: every
// byte arrives once, in order, unchanged, in both directions; and unless the bytes were tampered
// with, the library never fails a connection and delivers everything by the end.
//
// Built two ways (CMakeLists.txt): with libFuzzer (clang, -DTERN_FUZZ=ON) for coverage-guided
// runs, and with the driver at the bottom, which CTest runs under the sanitizers on inputs from a
// seeded generator and replays saved inputs (tests/fuzz runs libFuzzer).
#include "tern_tls.h"
#include "test_pki.h"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REQUIRE(cond)                                                                     \
    do                                                                                    \
    {                                                                                     \
        if (!(cond))                                                                      \
        {                                                                                 \
            fprintf(stderr, "%s:%d: requirement failed: %s\n", __FILE__, __LINE__, #cond); \
            abort();                                                                      \
        }                                                                                 \
    } while (0)

// Set by the driver from TERN_FUZZ_TRACE: every call and its result on stderr, to read a replay by.
static int s_trace;

#define TRACE(...)                            \
    do                                        \
    {                                         \
        if (s_trace)                          \
        {                                     \
            fprintf(stderr, __VA_ARGS__);     \
        }                                     \
    } while (0)

// The input, read front to back; past its end every read is 0 and Exhausted() is true.
typedef struct Script
{
    const uint8_t* data;
    size_t size;
    size_t at;
} Script;

static int Exhausted(const Script* script)
{
    return script->at >= script->size;
}

static uint8_t Next(Script* script)
{
    return script->at < script->size ? script->data[script->at++] : 0;
}

// A length of at most max, drawn so that the edges (0, 1, a record, a record and one, max) come
// up often and any value can.
static size_t NextSize(Script* script, size_t max)
{
    uint8_t kind = Next(script);
    size_t value;
    switch (kind & 7)
    {
    case 0: value = 0; break;
    case 1: value = 1u + (kind >> 3); break;
    case 2: value = 16384; break;
    case 3: value = 16384 + 1u + (kind >> 3); break;
    case 4: value = max; break;
    default: value = ((size_t)Next(script) << 8 | Next(script)) * (1u + (kind >> 6)); break;
    }

    return value > max ? max : value;
}

// The bytes each side sends, by their offset in its stream: a shifted or repeated byte shows.
static uint8_t Pattern(size_t offset, uint8_t salt)
{
    return (uint8_t)(offset ^ (offset >> 8) ^ (offset >> 16) ^ salt);
}

enum
{
    ClientSalt = 0x5a,
    ServerSalt = 0xc3,
    MaxChunk = 40000, // over two records, so that records split at every boundary
    MaxSteps = 400,
    MaxKeyUpdates = 3000, // 81 KB of answers at 27 bytes each
};

// Ciphertext on its way from the client to the server, where tampering happens.
typedef struct Wire
{
    uint8_t* data;
    size_t length;
    size_t capacity;
} Wire;

static void WireAppend(Wire* wire, const uint8_t* data, size_t length)
{
    if (wire->capacity - wire->length < length)
    {
        size_t capacity = wire->capacity == 0 ? 4096 : wire->capacity;
        while (capacity - wire->length < length)
        {
            capacity *= 2;
        }

        wire->data = realloc(wire->data, capacity);
        REQUIRE(wire->data != NULL);
        wire->capacity = capacity;
    }

    memcpy(wire->data + wire->length, data, length);
    wire->length += length;
}

static void WireConsume(Wire* wire, size_t count)
{
    memmove(wire->data, wire->data + count, wire->length - count);
    wire->length -= count;
}

// Client certificates (kind's bits 64 and 128): the server asks for none; asks for an optional one
// and the client sends none; requires one and the client sends one from the trusted CA; requires
// one and the client sends one from another CA, which must be refused. In TLS 1.2 the client's
// Certificate message goes in the clear, so tampering reaches OpenSSL's certificate parsing and
// the library's refusal path.
enum
{
    NoClientCertificate,
    OptionalNoneSent,
    RequiredTrustedSent,
    RequiredStrangerSent,
};

// What the scripts reached, for the driver's summary.
static struct
{
    long handshakes, resumed, refused, tampered, failed, clean, keyUpdates, unreadLimit, largestSpill, clientBytes, serverBytes;
} s_reached;

typedef struct Session
{
    Script* script;
    TernTlsConnection* server;
    SSL* client;
    BIO* toClient;   // what the server produced, for the client to read
    BIO* fromClient; // what the client wrote
    Wire wire;

    size_t clientSent;     // plaintext bytes the client wrote
    size_t serverReceived; // plaintext bytes Decrypt produced
    size_t serverSent;     // plaintext bytes Encrypt consumed
    size_t clientReceived; // plaintext bytes the client read
    size_t encryptChunk;   // plaintext offered to the last Encrypt that has not been taken yet
    int writePending;      // Encrypt wrote part of a record: only Encrypt with the same input may follow
    int decryptMore;       // the last Decrypt filled its window: OpenSSL may hold more plaintext
    int32_t pending;       // bytes in the spill buffer after the last call
    size_t produced;       // ciphertext bytes the server produced
    int keyUpdates;        // KeyUpdates the client sent

    int serverReady;   // Handshake returned OK
    int tampered;      // bytes on the wire were changed: failures are expected from then on
    int serverFailed;  // the library returned ERROR
    int clientFailed;  // the client gave up (tampering, or the server's alert)
    int clientClosed;  // the client sent close_notify
    int serverClosed;  // Decrypt returned CLOSED
    int serverShutdown; // the server sent close_notify
    int tls13;
    int mayTamper; // half the scripts leave the bytes alone, so that the no-loss checks apply to them
    int clientCertificates; // NoClientCertificate, OptionalNoneSent, ...
} Session;

// Moves what the client wrote onto the wire.
static void ClientFlush(Session* session)
{
    uint8_t* data = NULL;
    long length = BIO_get_mem_data(session->fromClient, (char**)&data);
    if (length > 0)
    {
        WireAppend(&session->wire, data, (size_t)length);
    }

    (void)BIO_reset(session->fromClient);
}

// Checks one result against the call that returned it.
static void CheckResult(Session* session, int32_t status, const TernTlsResult* result, size_t inputLength, size_t outputLength,
                        int mayFail)
{
    TRACE("  -> status %d consumed %d produced %d spilled %d pending %d drained %d\n", status, result->consumed,
          result->produced, result->spilled, result->pending, result->drained);
    REQUIRE(result->status == status);
    REQUIRE(status == TERN_TLS_OK || status == TERN_TLS_WANT_READ || status == TERN_TLS_CLOSED ||
            status == TERN_TLS_OUTPUT_FULL || status == TERN_TLS_ERROR || status == TERN_TLS_BAD_ARGUMENT);
    REQUIRE(result->consumed >= 0 && (size_t)result->consumed <= inputLength);
    REQUIRE(result->produced >= 0 && (size_t)result->produced <= outputLength);
    REQUIRE(result->drained >= 0 && result->drained <= result->produced);
    REQUIRE(result->spilled >= 0 && result->pending >= 0);
    if (status != TERN_TLS_BAD_ARGUMENT)
    {
        session->pending = result->pending;
        s_reached.largestSpill = result->pending > s_reached.largestSpill ? result->pending : s_reached.largestSpill;
    }

    if (status == TERN_TLS_ERROR)
    {
        char reason[512];
        REQUIRE(TernTls_ConnectionError(session->server, reason, sizeof(reason)) > 0);
        // Untouched traffic from a real client never fails a connection, unless it provoked more
        // answers than the library keeps unread (KeyUpdates the client did not read the replies to).
        // A certificate from an untrusted CA is refused, which is the point of that mode.
        REQUIRE(session->tampered || mayFail || strstr(reason, "does not read what TLS answers") != NULL ||
                (session->clientCertificates == RequiredStrangerSent && !session->serverReady));
        session->serverFailed = 1;
    }
}

// The client reads what it can and checks it against the server's stream.
static void ClientRead(Session* session)
{
    if (session->clientFailed)
    {
        return;
    }

    uint8_t buffer[8192];
    for (;;)
    {
        size_t read = 0;
        int ok = SSL_is_init_finished(session->client) ? SSL_read_ex(session->client, buffer, sizeof(buffer), &read)
                                                        : SSL_do_handshake(session->client);
        if (ok == 1)
        {
            for (size_t i = 0; i < read; i++)
            {
                REQUIRE(buffer[i] == Pattern(session->clientReceived + i, ServerSalt));
            }

            session->clientReceived += read;
            if (read == 0)
            {
                break;
            }

            continue;
        }

        int error = SSL_get_error(session->client, ok);
        if (error == SSL_ERROR_WANT_READ)
        {
            break;
        }

        // A close_notify the server sent, or an alert after tampering: the client is done.
        REQUIRE(error == SSL_ERROR_ZERO_RETURN ? session->serverShutdown : (session->tampered || session->serverFailed));
        session->clientFailed = 1;
        break;
    }

    ERR_clear_error();
    ClientFlush(session);
}

// Hands what the server produced to the client.
static void ToClient(Session* session, const uint8_t* output, int32_t produced)
{
    if (produced > 0)
    {
        session->produced += (size_t)produced;
        BIO_write(session->toClient, output, produced);
    }
}

// A window's size from the script; once it has run out, a roomy one, so that a session ends.
static size_t Window(Script* script)
{
    return Exhausted(script) ? 16384 + 64 : NextSize(script, MaxChunk);
}

// Drains the spill buffer through Encrypt with no input, as the transport does.
static void Drain(Session* session, size_t window)
{
    uint8_t* output = window == 0 ? NULL : malloc(window);
    TernTlsResult result;
    TRACE("drain window %zu\n", window);
    int32_t status = TernTls_Encrypt(session->server, NULL, 0, output, (int32_t)window, &result);
    CheckResult(session, status, &result, 0, window, 0);
    REQUIRE(result.consumed == 0);
    if (!session->serverFailed)
    {
        REQUIRE(result.drained == result.produced);
    }

    ToClient(session, output, result.produced);
    free(output);
}

// Feeds the server count bytes of the wire (as Handshake or Decrypt) through a window; returns
// how many it took.
static size_t ServerRead(Session* session, size_t count, size_t window)
{
    if (count > session->wire.length)
    {
        count = session->wire.length;
    }

    uint8_t* input = count == 0 ? NULL : malloc(count);
    if (count > 0)
    {
        memcpy(input, session->wire.data, count);
    }

    TernTlsResult result;
    memset(&result, 0xee, sizeof(result));
    int32_t status;
    uint8_t* output;
    if (!session->serverReady)
    {
        output = window == 0 ? NULL : malloc(window);
        TRACE("handshake input %zu window %zu\n", count, window);
        status = TernTls_Handshake(session->server, input, (int32_t)count, output, (int32_t)window, &result);
        CheckResult(session, status, &result, count, window, 0);
        REQUIRE(status == TERN_TLS_OK || status == TERN_TLS_WANT_READ || status == TERN_TLS_ERROR);
        session->serverReady = status == TERN_TLS_OK;
        ToClient(session, output, result.produced);
    }
    else
    {
        // Decrypt needs a window: an empty one is refused (checked below).
        if (window == 0)
        {
            status = TernTls_Decrypt(session->server, input, (int32_t)count, NULL, 0, &result);
            REQUIRE(status == TERN_TLS_BAD_ARGUMENT && result.status == status && result.produced == 0);
            free(input);
            return 0;
        }

        output = malloc(window);
        int32_t unread = session->pending;
        TRACE("decrypt input %zu of %zu window %zu\n", count, session->wire.length, window);
        status = TernTls_Decrypt(session->server, input, (int32_t)count, output, (int32_t)window, &result);
        if (session->writePending)
        {
            // A record is half written: the contract refuses Decrypt until Encrypt finishes it.
            REQUIRE(status == TERN_TLS_BAD_ARGUMENT && result.status == status && result.consumed == 0 && result.produced == 0);
            free(output);
            free(input);
            return 0;
        }

        CheckResult(session, status, &result, count, window, 0);
        REQUIRE(result.drained == 0); // Decrypt has no window for what OpenSSL writes
        if (unread > TERN_TLS_UNREAD_ANSWERS_LIMIT)
        {
            // A client that does not read its answers is stopped before anything more is read.
            REQUIRE(status == TERN_TLS_ERROR && result.consumed == 0 && result.produced == 0);
            s_reached.unreadLimit++;
        }

        if (session->serverClosed)
        {
            REQUIRE(result.produced == 0);
        }

        for (int32_t i = 0; i < result.produced; i++)
        {
            REQUIRE(output[i] == Pattern(session->serverReceived + (size_t)i, ClientSalt));
        }

        session->serverReceived += (size_t)result.produced;
        if (status == TERN_TLS_CLOSED)
        {
            // close_notify comes after everything the client wrote before it.
            REQUIRE(session->clientClosed || session->tampered);
            if (!session->tampered)
            {
                REQUIRE(session->serverReceived == session->clientSent);
            }

            session->serverClosed = 1;
        }

        if (status == TERN_TLS_OK)
        {
            REQUIRE((size_t)result.produced == window); // OK means the window filled up
        }

        if (status != TERN_TLS_BAD_ARGUMENT)
        {
            session->decryptMore = status == TERN_TLS_OK; // a refused call changed nothing
        }
    }

    if (status == TERN_TLS_WANT_READ)
    {
        REQUIRE((size_t)result.consumed == count); // "needs more input": all of it was used
    }

    WireConsume(&session->wire, (size_t)result.consumed);
    free(output);
    free(input);
    if (result.pending > 0 && !session->serverFailed)
    {
        // Often a small window, so that the spill buffer is left part drained.
        uint8_t small = Exhausted(session->script) ? 255 : Next(session->script);
        Drain(session, small < 96 ? small : Window(session->script));
    }

    ClientRead(session);
    return (size_t)result.consumed;
}

// Encrypts the server's next plaintext through a window; after OUTPUT_FULL with nothing taken the
// same input is offered again, as the contract asks.
static void ServerWrite(Session* session, size_t size, size_t window)
{
    if (!session->writePending && session->encryptChunk == 0)
    {
        session->encryptChunk = size;
    }

    size_t length = session->encryptChunk;
    uint8_t* input = length == 0 ? NULL : malloc(length);
    for (size_t i = 0; i < length; i++)
    {
        input[i] = Pattern(session->serverSent + i, ServerSalt);
    }

    uint8_t* output = window == 0 ? NULL : malloc(window);
    TernTlsResult result;
    TRACE("encrypt input %zu window %zu\n", length, window);
    int32_t status = TernTls_Encrypt(session->server, input, (int32_t)length, output, (int32_t)window, &result);
    // Nothing is sent after close_notify: OpenSSL refuses it.
    CheckResult(session, status, &result, length, window, session->serverShutdown && length > 0);
    if (status == TERN_TLS_ERROR && session->serverShutdown)
    {
        session->serverFailed = 0; // refused, not failed: the connection can still read
        session->encryptChunk = 0;
    }
    else if (status != TERN_TLS_ERROR)
    {
        // Before its handshake is done the server has nothing to encrypt with; the transport
        // never asks then, but the answer must still be sane.
        REQUIRE(status == TERN_TLS_OK || status == TERN_TLS_OUTPUT_FULL || (status == TERN_TLS_WANT_READ && !session->serverReady));
        if (length > 0 && window > 0 && result.pending == 0)
        {
            // The library wrote (or went on writing) a record: it is half out exactly when the
            // window filled first. Otherwise (spill left, no window) nothing changed.
            session->writePending = status == TERN_TLS_OUTPUT_FULL;
        }

        if (length > 0 && window == 0)
        {
            REQUIRE(status == TERN_TLS_OUTPUT_FULL && result.consumed == 0); // no room is not "done"
        }

        session->serverSent += (size_t)result.consumed;
        session->encryptChunk -= (size_t)result.consumed;
    }

    ToClient(session, output, result.produced);
    free(output);
    free(input);
    ClientRead(session);
}

static void ClientWrite(Session* session, size_t size)
{
    if (session->clientFailed || session->clientClosed || size == 0)
    {
        return;
    }

    uint8_t* data = malloc(size);
    for (size_t i = 0; i < size; i++)
    {
        data[i] = Pattern(session->clientSent + i, ClientSalt);
    }

    size_t written = 0;
    TRACE("client writes %zu\n", size);
    if (SSL_write_ex(session->client, data, size, &written) == 1)
    {
        REQUIRE(written == size);
        session->clientSent += written;
    }
    else
    {
        // Only a client that already read an alert or a close_notify fails to write.
        REQUIRE(session->tampered || session->serverShutdown || session->serverFailed);
        session->clientFailed = 1;
        ERR_clear_error();
    }

    free(data);
    ClientFlush(session);
}

// Changes the bytes in flight: one flipped, some inserted, or the rest cut off.
static void Tamper(Session* session)
{
    Script* script = session->script;
    uint8_t kind = Next(script);
    size_t at = session->wire.length == 0 ? 0 : ((size_t)Next(script) << 8 | Next(script)) % (session->wire.length + 1);
    switch (kind % 3)
    {
    case 0:
        if (at < session->wire.length)
        {
            uint8_t mask = Next(script);
            session->wire.data[at] ^= mask == 0 ? 1 : mask;
            session->tampered = 1;
        }

        break;
    case 1:
    {
        size_t count = 1 + Next(script) % 64;
        uint8_t bytes[64];
        for (size_t i = 0; i < count; i++)
        {
            bytes[i] = Next(script);
        }

        size_t tail = session->wire.length - at;
        WireAppend(&session->wire, bytes, count); // grows the buffer; the bytes move into place below
        memmove(session->wire.data + at + count, session->wire.data + at, tail);
        memcpy(session->wire.data + at, bytes, count);
        session->tampered = 1;
        break;
    }
    default:
        if (at < session->wire.length)
        {
            session->wire.length = at;
            session->tampered = 1;
        }

        break;
    }
}

static void Step(Session* session)
{
    Script* script = session->script;
    uint8_t op = Next(script);
    if (op % 10 == 6 && !session->mayTamper)
    {
        op = 0;
    }

    switch (op % 10)
    {
    case 0:
    case 1:
        ClientWrite(session, NextSize(script, MaxChunk));
        break;
    case 2:
    case 3:
    {
        size_t count = NextSize(script, session->wire.length);
        ServerRead(session, count, NextSize(script, MaxChunk));
        break;
    }
    case 4:
    case 5:
    {
        size_t size = NextSize(script, MaxChunk);
        ServerWrite(session, size, NextSize(script, MaxChunk));
        break;
    }
    case 6:
        Tamper(session);
        break;
    case 7:
        if (session->tls13 && !session->clientFailed && !session->clientClosed)
        {
            // The server answers a requested KeyUpdate with its own: written during Decrypt,
            // where there is no window, so it goes through the spill buffer. Often many at once,
            // so that unread answers pile up there: a quarter of the time 120 to 183 (each answer
            // is 27 bytes, so around the buffer's first 4 KB, where after a partial drain it is
            // compacted or grown), an eighth of the time up to 249.
            uint8_t burst = Next(script);
            int count = burst < 160 ? 1 : burst < 224 ? 120 + (burst - 160) : 1 + (burst - 224) * 8;
            // At most MaxKeyUpdates a session: enough to pass the 64 KB limit on unread answers,
            // few enough that no script takes long.
            for (; count > 0 && session->keyUpdates < MaxKeyUpdates; count--)
            {
                REQUIRE(SSL_key_update(session->client, SSL_KEY_UPDATE_REQUESTED) == 1);
                session->keyUpdates++;
                s_reached.keyUpdates++;
                REQUIRE(SSL_do_handshake(session->client) == 1);
            }

            ClientFlush(session);
        }

        break;
    case 8:
        if (!session->clientFailed && !session->clientClosed)
        {
            SSL_shutdown(session->client);
            session->clientClosed = 1;
            ClientFlush(session);
        }

        break;
    default:
    {
        size_t window = NextSize(script, MaxChunk);
        uint8_t* output = window == 0 ? NULL : malloc(window);
        TernTlsResult result;
        int32_t status = TernTls_Shutdown(session->server, output, (int32_t)window, &result);
        if (session->writePending)
        {
            REQUIRE(status == TERN_TLS_BAD_ARGUMENT && result.produced == 0);
        }
        else
        {
            CheckResult(session, status, &result, 0, window, 0);
            session->serverShutdown |= status == TERN_TLS_OK && session->serverReady;
            ToClient(session, output, result.produced);
        }

        free(output);
        REQUIRE(TernTls_ConnectionPartialRecord(session->server) == 0 || TernTls_ConnectionPartialRecord(session->server) == 1);
        ClientRead(session);
        break;
    }
    }
}

static TernTlsServer* s_servers[3]; // by TERN_TLS_CLIENT_CERTIFICATES_*
static SSL_CTX* s_clients[2];
static ClientPki s_pki; // trusted: issued by the CA the servers trust; stranger: by another

// A client that asks for large.fuzz.test gets a certificate of about 22 KB: the server's flight
// then outgrows the spill buffer's first 4 KB.
static int32_t SelectLarge(void* state, const char* name, int32_t length)
{
    (void)state;
    return name != NULL && length == 15 && memcmp(name, "large.fuzz.test", 15) == 0 ? 1 : -1;
}

static void Setup(void)
{
    if (s_servers[0] != NULL)
    {
        return;
    }

    s_pki = MakeClientPki(KeyEd25519); // kept for the whole run: the sessions use its identities

    static const uint8_t alpn[] = "\x02h2\x08http/1.1";
    // Ed25519 throughout: its signatures have one length, so a script replays with the same lengths.
    Pem pems[2] = {MakeLargeCertificate("fuzz.test", 0, KeyEd25519), MakeLargeCertificate("large.fuzz.test", 1000, KeyEd25519)};
    for (int mode = 0; mode < 3; mode++)
    {
        REQUIRE(TernTls_ServerCreate(alpn, (int32_t)sizeof(alpn) - 1, SelectLarge, NULL, &s_servers[mode]) == TERN_TLS_OK);
        for (int i = 0; i < 2; i++)
        {
            REQUIRE(TernTls_ServerAddCertificate(s_servers[mode], (const uint8_t*)pems[i].certificate, pems[i].certificateLength,
                                                 (const uint8_t*)pems[i].key, pems[i].keyLength) == i);
        }

        if (mode != TERN_TLS_CLIENT_CERTIFICATES_NONE)
        {
            REQUIRE(TernTls_ServerSetClientCertificates(s_servers[mode], mode, (const uint8_t*)s_pki.authorityPem, s_pki.authorityPemLength) == TERN_TLS_OK);
        }
    }

    for (int i = 0; i < 2; i++)
    {
        FreePem(&pems[i]);
    }


    const int versions[2] = {TLS1_2_VERSION, TLS1_3_VERSION};
    for (int i = 0; i < 2; i++)
    {
        s_clients[i] = SSL_CTX_new(TLS_client_method());
        REQUIRE(s_clients[i] != NULL);
        SSL_CTX_set_min_proto_version(s_clients[i], versions[i]);
        SSL_CTX_set_max_proto_version(s_clients[i], versions[i]);
        // The server sends its tickets after the handshake; the client has no use for them.
        SSL_CTX_set_session_cache_mode(s_clients[i], SSL_SESS_CACHE_OFF);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

// ALPN lists a client may offer, and what the server (h2, then http/1.1) picks from each.
static const char* const s_alpnOffered[4] = {NULL, "\x02h2\x08http/1.1", "\x08http/1.1", "\x03" "foo"};
static const char* const s_alpnPicked[4] = {"", "h2", "http/1.1", ""};

// Starts a session: kind's bits pick TLS 1.3 (1), tampering (2), the large certificate (4), the
// ALPN offer (8, 16), client certificates (64, 128); resume, when not NULL, is a session to resume.
static void Open(Session* session, Script* script, uint8_t kind, SSL_SESSION* resume)
{
    memset(session, 0, sizeof(*session));
    session->script = script;
    session->tls13 = kind & 1;
    session->mayTamper = (kind >> 1) & 1;
    session->clientCertificates = kind >> 6;
    session->client = SSL_new(s_clients[session->tls13]);
    session->toClient = BIO_new(BIO_s_mem());
    session->fromClient = BIO_new(BIO_s_mem());
    REQUIRE(session->client != NULL && session->toClient != NULL && session->fromClient != NULL);
    SSL_set_bio(session->client, session->toClient, session->fromClient);
    SSL_set_connect_state(session->client);
    const char* serverName = (kind >> 2) & 1 ? "large.fuzz.test" : "fuzz.test";
    SSL_set_tlsext_host_name(session->client, serverName);
    const char* alpn = s_alpnOffered[(kind >> 3) & 3];
    if (alpn != NULL)
    {
        REQUIRE(SSL_set_alpn_protos(session->client, (const unsigned char*)alpn, (unsigned int)strlen(alpn)) == 0);
    }

    if (resume != NULL)
    {
        REQUIRE(SSL_set_session(session->client, resume) == 1);
    }

    static const int servers[4] = {TERN_TLS_CLIENT_CERTIFICATES_NONE, TERN_TLS_CLIENT_CERTIFICATES_OPTIONAL,
                                   TERN_TLS_CLIENT_CERTIFICATES_REQUIRED, TERN_TLS_CLIENT_CERTIFICATES_REQUIRED};
    const Identity* identity = session->clientCertificates == RequiredTrustedSent ? &s_pki.trusted
                             : session->clientCertificates == RequiredStrangerSent ? &s_pki.stranger
                                                                                   : NULL;
    if (identity != NULL)
    {
        REQUIRE(SSL_use_certificate(session->client, identity->certificate) == 1);
        REQUIRE(SSL_use_PrivateKey(session->client, identity->key) == 1);
    }

    REQUIRE(TernTls_ConnectionCreate(s_servers[servers[session->clientCertificates]], &session->server) == TERN_TLS_OK);
}

// The handshake, step by step: the script picks each step's input and window, and may tamper.
static void HandshakeSteps(Session* session)
{
    Script* script = session->script;
    ClientRead(session); // the ClientHello
    // Past MaxSteps the script's choices give way to roomy windows, as when it runs out, so that
    // every handshake ends in success or a failure (the client-certificate checks need that).
    int steps = 0;
    while (!session->serverFailed && !session->clientFailed && steps++ < 2 * MaxSteps &&
           !(SSL_is_init_finished(session->client) && session->wire.length == 0))
    {
        if (Exhausted(script) || steps > MaxSteps)
        {
            size_t wire = session->wire.length;
            size_t produced = session->produced;
            Drain(session, 16384);
            if (ServerRead(session, session->wire.length, 16384) == 0 && session->wire.length == wire && session->produced == produced)
            {
                break; // nothing moved: tampering left bytes that can never make a record
            }

            continue;
        }

        if (Next(script) % 8 == 0 && session->mayTamper)
        {
            Tamper(session);
            continue;
        }

        size_t count = NextSize(script, session->wire.length);
        ServerRead(session, count, NextSize(script, MaxChunk));
    }
}

// Copies one of the connection's texts into a buffer of exactly capacity bytes.
static void CheckText(Session* session, int32_t (*query)(TernTlsConnection*, char*, int32_t), const char* expected)
{
    size_t capacity = 1 + Next(session->script) % 24;
    char* buffer = malloc(capacity);
    int32_t length = query(session->server, buffer, (int32_t)capacity);
    if (expected != NULL)
    {
        size_t shown = strlen(expected) < capacity - 1 ? strlen(expected) : capacity - 1;
        REQUIRE(length == (int32_t)shown && memcmp(buffer, expected, shown) == 0);
    }

    REQUIRE(length >= 0 && (size_t)length < capacity && buffer[length] == '\0');
    REQUIRE(query(session->server, NULL, 0) == -1);
    free(buffer);
}

// What the handshake settled, as the transport asks it.
static void CheckNegotiated(Session* session, uint8_t kind, int resumed)
{
    if (!session->serverReady || session->tampered)
    {
        return;
    }

    REQUIRE(TernTls_ConnectionProtocol(session->server) == (session->tls13 ? TLS1_3_VERSION : TLS1_2_VERSION));
    REQUIRE(TernTls_ConnectionResumed(session->server) == resumed);
    s_reached.resumed += resumed;
    CheckText(session, TernTls_ConnectionAlpn, s_alpnPicked[(kind >> 3) & 3]);
    CheckText(session, TernTls_ConnectionServerName, (kind >> 2) & 1 ? "large.fuzz.test" : "fuzz.test");
    CheckText(session, TernTls_ConnectionCipher, NULL);
    REQUIRE(TernTls_ConnectionClientCertificateRefused(session->server) == 0);
    if (session->clientCertificates != RequiredTrustedSent)
    {
        REQUIRE(TernTls_ConnectionPeerCertificate(session->server, NULL, 0) == 0);
        return;
    }

    // The client's certificate, copied only into a buffer that holds all of it.
    unsigned char* expected = NULL;
    int length = i2d_X509(s_pki.trusted.certificate, &expected);
    REQUIRE(length > 0 && TernTls_ConnectionPeerCertificate(session->server, NULL, 0) == -length);
    uint8_t* der = malloc((size_t)length);
    REQUIRE(TernTls_ConnectionPeerCertificate(session->server, der, length - 1) == -length);
    REQUIRE(TernTls_ConnectionPeerCertificate(session->server, der, length) == length && memcmp(der, expected, (size_t)length) == 0);
    free(der);
    OPENSSL_free(expected);
}

// A client certificate from a CA the server does not trust ends the handshake, and says so.
static void CheckRefused(Session* session)
{
    if (session->clientCertificates != RequiredStrangerSent || session->tampered)
    {
        return;
    }

    char reason[512];
    REQUIRE(session->serverFailed && !session->serverReady);
    REQUIRE(TernTls_ConnectionClientCertificateRefused(session->server) == 1);
    REQUIRE(TernTls_ConnectionError(session->server, reason, sizeof(reason)) > 0 && strstr(reason, "client certificate") != NULL);
    s_reached.refused++;
}

// Last, everything in flight is delivered through roomy windows: nothing may be lost.
static void Flush(Session* session)
{
    if (!SSL_is_init_finished(session->client) || session->tampered || session->serverFailed)
    {
        return;
    }

    // Until nothing is left or a round moves nothing (then the checks below say what is stuck).
    size_t moved = 1;
    while (moved > 0 && (session->encryptChunk > 0 || session->wire.length > 0 || session->decryptMore))
    {
        size_t before = session->produced + session->serverReceived + session->wire.length;
        if (session->encryptChunk > 0)
        {
            ServerWrite(session, 0, 16384 + 64);
        }

        // A transport drains what the server answered before it reads on; past 64 KB of
        // unread answers the library stops reading (checked in ServerRead).
        for (int round = 0; round < 64 && session->pending > 0 && !session->writePending; round++)
        {
            Drain(session, 16384 + 64);
        }

        if ((session->wire.length > 0 || session->decryptMore) && !session->serverClosed)
        {
            ServerRead(session, session->wire.length, 65536);
        }
        else if (session->serverClosed)
        {
            session->wire.length = 0; // the client wrote nothing after its close_notify
        }

        size_t after = session->produced + session->serverReceived + session->wire.length;
        moved = after != before;
    }

    if (session->serverFailed)
    {
        return; // stopped for answers left unread (the only failure CheckResult lets through)
    }

    REQUIRE(session->encryptChunk == 0 && !session->writePending);
    REQUIRE(session->serverReceived == session->clientSent);
    if (!session->serverShutdown && !session->clientFailed)
    {
        REQUIRE(session->clientReceived == session->serverSent);
    }
}

static void Close(Session* session)
{
    s_reached.handshakes += session->serverReady;
    s_reached.tampered += session->tampered;
    s_reached.failed += session->serverFailed;
    s_reached.clean += session->serverReady && !session->tampered;
    s_reached.clientBytes += (long)session->serverReceived;
    s_reached.serverBytes += (long)session->clientReceived;
    TernTls_ConnectionFree(session->server);
    SSL_free(session->client);
    free(session->wire.data);
    ERR_clear_error();
}

// A session to resume: a handshake through roomy windows, its tickets read by the client.
static SSL_SESSION* Prime(uint8_t kind)
{
    Script none = {NULL, 0, 0};
    Session session;
    Open(&session, &none, (uint8_t)(kind & 0xfd), NULL); // never tampered
    HandshakeSteps(&session);
    REQUIRE(session.serverReady && SSL_is_init_finished(session.client));
    ClientRead(&session); // TLS 1.3 sends its tickets after the handshake
    SSL_SESSION* resumable = SSL_get1_session(session.client);
    REQUIRE(resumable != NULL && SSL_SESSION_is_resumable(resumable));
    SSL_shutdown(session.client); // OpenSSL keeps a session resumable only after a clean close
    Close(&session);
    return resumable;
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size)
{
    Setup();
    Script script = {data, size, 0};
    uint8_t kind = Next(&script);
    // Bit 32: resume a session from an earlier handshake with the same settings, which brings the
    // server's ticket decryption into play (and, with tampering, damaged tickets).
    SSL_SESSION* resume = (kind >> 5) & 1 && kind >> 6 != RequiredStrangerSent ? Prime(kind) : NULL;
    Session session;
    Open(&session, &script, kind, resume);
    HandshakeSteps(&session);
    CheckNegotiated(&session, kind, resume != NULL);
    CheckRefused(&session);

    // Then the data: writes, reads, KeyUpdates and closes in the order the script gives.
    int steps = 0;
    while (SSL_is_init_finished(session.client) && !session.serverFailed && !Exhausted(&script) && steps++ < MaxSteps)
    {
        Step(&session);
    }

    Flush(&session);
    Close(&session);
    SSL_SESSION_free(resume);
    return 0;
}

#ifndef TERN_LIBFUZZER
// The driver CTest runs: `tern_tls_fuzz --random COUNT SEED` makes COUNT scripts of up to 600
// bytes from a seeded generator; `tern_tls_fuzz --hex FILE` replays the inputs written in FILE in
// hex, one a line (# starts a comment); any other argument is a saved input (a libFuzzer crash
// file, say) to replay.
static uint64_t s_state;

static uint8_t RandomByte(void)
{
    s_state ^= s_state << 13;
    s_state ^= s_state >> 7;
    s_state ^= s_state << 17;
    return (uint8_t)(s_state >> 32);
}

int main(int argc, char** argv)
{
    s_trace = getenv("TERN_FUZZ_TRACE") != NULL;
    if (argc == 4 && strcmp(argv[1], "--random") == 0)
    {
        long count = strtol(argv[2], NULL, 10);
        s_state = 0x9e3779b97f4a7c15ull ^ (uint64_t)strtoull(argv[3], NULL, 10);
        uint8_t script[600];
        for (long i = 0; i < count; i++)
        {
            size_t size = 1 + ((size_t)RandomByte() << 8 | RandomByte()) % sizeof(script);
            for (size_t b = 0; b < size; b++)
            {
                script[b] = RandomByte();
            }

            LLVMFuzzerTestOneInput(script, size);
        }

        printf("%ld scripts: %ld handshakes done (%ld resumed), %ld client certificates refused, %ld sessions tampered with (%ld failed), %ld clean to the end; "
               "%ld KeyUpdates (%ld times too many unread; at most %ld bytes waiting to be drained); %ld bytes to the server, %ld to the client, each checked\n",
               count, s_reached.handshakes, s_reached.resumed, s_reached.refused, s_reached.tampered, s_reached.failed, s_reached.clean, s_reached.keyUpdates,
               s_reached.unreadLimit, s_reached.largestSpill, s_reached.clientBytes, s_reached.serverBytes);
        return 0;
    }

    if (argc == 3 && strcmp(argv[1], "--hex") == 0)
    {
        FILE* file = fopen(argv[2], "r");
        REQUIRE(file != NULL);
        static char line[1 << 16];
        static uint8_t input[sizeof(line) / 2];
        int count = 0;
        while (fgets(line, sizeof(line), file) != NULL)
        {
            REQUIRE(strchr(line, '\n') != NULL || feof(file)); // one input a line, none longer than the buffer
            size_t size = 0;
            for (const char* c = line; isxdigit((unsigned char)c[0]); c += 2)
            {
                REQUIRE(isxdigit((unsigned char)c[1])); // two digits a byte
                unsigned int byte = 0;
                sscanf(c, "%2x", &byte);
                input[size++] = (uint8_t)byte;
            }

            if (size > 0)
            {
                LLVMFuzzerTestOneInput(input, size);
                count++;
            }
        }

        fclose(file);
        printf("%s: %d inputs replayed\n", argv[2], count);
        return 0;
    }

    for (int i = 1; i < argc; i++)
    {
        FILE* file = fopen(argv[i], "rb");
        REQUIRE(file != NULL);
        static uint8_t input[1 << 20];
        size_t size = fread(input, 1, sizeof(input), file);
        fclose(file);
        LLVMFuzzerTestOneInput(input, size);
        printf("%s: ok\n", argv[i]);
    }

    return 0;
}
#endif
