// Tests of libtern_tls against a real OpenSSL client, run by CTest under
// AddressSanitizer, LeakSanitizer and UndefinedBehaviorSanitizer in CI.
#include "tern_tls.h"
#include "test_pki.h"

#include <openssl/core_names.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <malloc.h>

#if defined(__SANITIZE_ADDRESS__)
// Exported by the AddressSanitizer runtime (its header is not always installed).
size_t __sanitizer_get_current_allocated_bytes(void);
#endif
#include <stdlib.h>
#include <string.h>

static int failures;

#define CHECK(cond)                                                                    \
    do                                                                                 \
    {                                                                                  \
        if (!(cond))                                                                   \
        {                                                                              \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
            failures++;                                                                \
        }                                                                              \
    } while (0)

static Pem s_default;
static Pem s_other;
static int s_selectorCalls;

static int32_t SelectByName(void* state, const char* name, int32_t length)
{
    (void)state;
    s_selectorCalls++;
    return name != NULL && length == 10 && memcmp(name, "other.test", 10) == 0 ? 1 : -1;
}

static TernTlsServer* CreateServer(void)
{
    static const uint8_t alpn[] = "\x02h2\x08http/1.1";
    TernTlsServer* server = NULL;
    CHECK(TernTls_ServerCreate(alpn, (int32_t)sizeof(alpn) - 1, SelectByName, NULL, &server) == TERN_TLS_OK);
    CHECK(TernTls_ServerAddCertificate(server, (const uint8_t*)s_default.certificate, s_default.certificateLength, (const uint8_t*)s_default.key, s_default.keyLength) == 0);
    CHECK(TernTls_ServerAddCertificate(server, (const uint8_t*)s_other.certificate, s_other.certificateLength, (const uint8_t*)s_other.key, s_other.keyLength) == 1);
    return server;
}

typedef struct Client
{
    SSL_CTX* context;
    SSL* ssl;
    BIO* toClient;   // bytes the server sent, read by the client
    BIO* fromClient; // bytes the client wrote, for the server
} Client;

static Client NewClient(int maxVersion, const char* serverName, const char* alpn, SSL_SESSION* session)
{
    Client client;
    client.context = SSL_CTX_new(TLS_client_method());
    SSL_CTX_set_max_proto_version(client.context, maxVersion);
    client.ssl = SSL_new(client.context);
    if (session != NULL)
    {
        SSL_set_session(client.ssl, session);
    }

    client.toClient = BIO_new(BIO_s_mem());
    client.fromClient = BIO_new(BIO_s_mem());
    SSL_set_bio(client.ssl, client.toClient, client.fromClient);
    SSL_set_connect_state(client.ssl);
    if (serverName != NULL)
    {
        SSL_set_tlsext_host_name(client.ssl, serverName);
    }

    if (alpn != NULL)
    {
        SSL_set_alpn_protos(client.ssl, (const unsigned char*)alpn, (unsigned int)strlen(alpn));
    }


    return client;
}

static void FreeClient(Client* client)
{
    SSL_free(client->ssl);
    SSL_CTX_free(client->context);
}

// Whether the certificate the server sent this client has the common name expected.
static int PeerNameIs(Client* client, const char* expected)
{
    X509* peer = SSL_get1_peer_certificate(client->ssl);
    char subject[128] = {0};
    if (peer != NULL)
    {
        X509_NAME_get_text_by_NID(X509_get_subject_name(peer), NID_commonName, subject, sizeof(subject));
        X509_free(peer);
    }

    return strcmp(subject, expected) == 0;
}

// Moves what the client wrote into the server operation, feeding at most
// chunk bytes per call, and what the server produced back to the client.
// Returns the last status.
typedef int32_t (*Operation)(TernTlsConnection*, const uint8_t*, int32_t, uint8_t*, int32_t, TernTlsResult*);

static long s_drained;

static int32_t FeedServer(Client* client, TernTlsConnection* connection, int chunk, int window, TernTlsResult* last)
{
    uint8_t* input = NULL;
    long length = BIO_get_mem_data(client->fromClient, (char**)&input);
    uint8_t* copy = malloc((size_t)length + 1);
    memcpy(copy, input, (size_t)length);
    (void)BIO_reset(client->fromClient);
    uint8_t* output = malloc((size_t)window);
    long offset = 0;
    int32_t status = TERN_TLS_WANT_READ;
    do
    {
        int32_t size = (int32_t)(length - offset < chunk ? length - offset : chunk);
        status = TernTls_Handshake(connection, copy + offset, size, output, window, last);
        offset += last->consumed;
        BIO_write(client->toClient, output, last->produced);
        s_drained += last->drained;
        while (last->pending > 0 && status >= 0)
        {
            TernTlsResult drain;
            TernTls_Handshake(connection, NULL, 0, output, window, &drain);
            BIO_write(client->toClient, output, drain.produced);
            CHECK(drain.drained == drain.produced);
            s_drained += drain.drained;
            last->pending = drain.pending;
            last->spilled += drain.spilled;
        }
    } while (offset < length && status == TERN_TLS_WANT_READ);

    free(copy);
    free(output);
    return status;
}

static int Handshake(Client* client, TernTlsConnection* connection, int chunk, int window, int* spilled)
{
    TernTlsResult result;
    memset(&result, 0, sizeof(result));
    int32_t status = TERN_TLS_WANT_READ;
    for (int round = 0; round < 20; round++)
    {
        int rc = SSL_do_handshake(client->ssl);
        status = FeedServer(client, connection, chunk, window, &result);
        if (spilled != NULL)
        {
            *spilled += result.spilled;
        }

        if (status < 0)
        {
            return 0;
        }

        if (rc == 1 && status == TERN_TLS_OK)
        {
            return 1;
        }
    }

    return 0;
}

static void Handshakes_Tls12AndTls13_NegotiateProtocolAlpnAndSni(void)
{
    TernTlsServer* server = CreateServer();
    int versions[] = {TLS1_2_VERSION, TLS1_3_VERSION};
    for (int i = 0; i < 2; i++)
    {
        Client client = NewClient(versions[i], "other.test", "\x02h2\x08http/1.1", NULL);
        TernTlsConnection* connection = NULL;
        CHECK(TernTls_ConnectionCreate(server, &connection) == TERN_TLS_OK);
        CHECK(Handshake(&client, connection, 1 << 20, 16384, NULL));
        CHECK(TernTls_ConnectionProtocol(connection) == versions[i]);

        char text[128];
        CHECK(TernTls_ConnectionAlpn(connection, text, sizeof(text)) == 2 && strcmp(text, "h2") == 0);
        CHECK(TernTls_ConnectionServerName(connection, text, sizeof(text)) > 0 && strcmp(text, "other.test") == 0);
        CHECK(TernTls_ConnectionCipher(connection, text, sizeof(text)) > 0);

        // SNI chose the second certificate.
        CHECK(PeerNameIs(&client, "other.test"));

        TernTls_ConnectionFree(connection);
        FreeClient(&client);
    }

    TernTls_ServerRelease(server);
}

static void Handshake_NoSniAndHttp11Only_UsesDefaultCertificateAndHttp11(void)
{
    TernTlsServer* server = CreateServer();
    Client client = NewClient(TLS1_3_VERSION, NULL, "\x08http/1.1", NULL);
    TernTlsConnection* connection = NULL;
    TernTls_ConnectionCreate(server, &connection);
    CHECK(Handshake(&client, connection, 1 << 20, 16384, NULL));
    char text[64];
    CHECK(TernTls_ConnectionAlpn(connection, text, sizeof(text)) == 8 && strcmp(text, "http/1.1") == 0);
    CHECK(PeerNameIs(&client, "default.test"));
    TernTls_ConnectionFree(connection);
    FreeClient(&client);
    TernTls_ServerRelease(server);
}

static void Handshake_OneByteInputsAndTinyOutputWindow_SpillsAndCompletes(void)
{
    TernTlsServer* server = CreateServer();
    Client client = NewClient(TLS1_3_VERSION, "default.test", "\x02h2", NULL);
    TernTlsConnection* connection = NULL;
    TernTls_ConnectionCreate(server, &connection);
    int spilled = 0;
    s_drained = 0;
    CHECK(Handshake(&client, connection, 1, 64, &spilled));
    CHECK(spilled > 0);
    CHECK(s_drained == spilled); // every spilled byte is accounted for on its way out
    TernTls_ConnectionFree(connection);
    FreeClient(&client);
    TernTls_ServerRelease(server);
}

static void Data_BothDirections_ArriveByteForByteAcrossSmallWindows(void)
{
    TernTlsServer* server = CreateServer();
    Client client = NewClient(TLS1_3_VERSION, "default.test", "\x02h2", NULL);
    TernTlsConnection* connection = NULL;
    TernTls_ConnectionCreate(server, &connection);
    CHECK(Handshake(&client, connection, 1 << 20, 16384, NULL));

    enum { Size = 1 << 20 };
    uint8_t* sent = malloc(Size);
    uint8_t* received = malloc(Size);
    for (size_t i = 0; i < Size; i++)
    {
        sent[i] = (uint8_t)(i * 31 + (i >> 11));
    }

    // Client to server: 16 KB records decrypted into 4 KB windows, input fed in
    // odd-sized pieces so records split across reads (and, at first, 1 byte at a time).
    size_t written = 0;
    CHECK(SSL_write_ex(client.ssl, sent, Size, &written) == 1 && written == Size);
    uint8_t* ciphertext = NULL;
    long length = BIO_get_mem_data(client.fromClient, (char**)&ciphertext);
    long offset = 0;
    size_t total = 0;
    int calls = 0;
    while (offset < length || calls == 0)
    {
        long piece = offset < 300 ? 1 : 7001;
        int32_t size = (int32_t)(length - offset < piece ? length - offset : piece);
        TernTlsResult result;
        int32_t status;
        do
        {
            status = TernTls_Decrypt(connection, ciphertext + offset, size, received + total, (int32_t)(Size - total < 4096 ? Size - total : 4096), &result);
            offset += result.consumed;
            size -= result.consumed;
            total += (size_t)result.produced;
            calls++;
        } while (status == TERN_TLS_OK && total < Size);
        CHECK(status == TERN_TLS_OK || status == TERN_TLS_WANT_READ);
        if (status < 0)
        {
            break;
        }
    }

    CHECK(total == Size && memcmp(sent, received, Size) == 0);
    (void)BIO_reset(client.fromClient);

    // Server to client: 16 KB records written across windows of 4 KB, 1,500 and 7 bytes (the
    // record continues in the next window: nothing spills), read back in order by the client.
    uint8_t window[4096];
    const size_t windows[] = {4096, 1500, 7};
    size_t taken = 0;
    int spills = 0;
    int straddled = 0;
    int refusedWhilePending = 0;
    for (int call = 0; taken < Size; call++)
    {
        TernTlsResult result;
        size_t chunk = Size - taken < 16384 ? Size - taken : 16384;
        int32_t status = TernTls_Encrypt(connection, sent + taken, (int32_t)chunk, window, (int32_t)windows[call % 3], &result);
        CHECK(status >= 0);
        taken += (size_t)result.consumed;
        spills += result.spilled > 0;
        BIO_write(client.toClient, window, result.produced);
        if (status == TERN_TLS_OUTPUT_FULL && result.consumed == 0)
        {
            straddled++;
            if (refusedWhilePending == 0)
            {
                // No read may run while a record is half written.
                TernTlsResult refused;
                uint8_t byte = 0;
                refusedWhilePending = TernTls_Decrypt(connection, &byte, 1, received, 1, &refused) == TERN_TLS_BAD_ARGUMENT;
            }
        }

        CHECK(result.pending == 0);
    }

    CHECK(spills == 0);
    CHECK(straddled > 0);
    CHECK(refusedWhilePending == 1);
    size_t read = 0;
    total = 0;
    while (total < Size && SSL_read_ex(client.ssl, received + total, Size - total, &read) == 1)
    {
        total += read;
    }

    CHECK(total == Size && memcmp(sent, received, Size) == 0);

    // close_notify from the client is reported as CLOSED.
    SSL_shutdown(client.ssl);
    length = BIO_get_mem_data(client.fromClient, (char**)&ciphertext);
    TernTlsResult result;
    CHECK(TernTls_Decrypt(connection, ciphertext, (int32_t)length, received, 4096, &result) == TERN_TLS_CLOSED);

    free(sent);
    free(received);
    TernTls_ConnectionFree(connection);
    FreeClient(&client);
    TernTls_ServerRelease(server);
}

// Runs one handshake on server with session (may be NULL); returns whether the
// server resumed, and the session to offer next time in *next.
static int HandshakeResumes(TernTlsServer* server, int version, SSL_SESSION* session, SSL_SESSION** next)
{
    Client client = NewClient(version, "default.test", "\x02h2", session);
    TernTlsConnection* connection = NULL;
    TernTls_ConnectionCreate(server, &connection);
    CHECK(Handshake(&client, connection, 1 << 20, 16384, NULL));
    // TLS 1.3 tickets arrive after the handshake: let the client read them.
    uint8_t byte;
    size_t read;
    SSL_read_ex(client.ssl, &byte, 1, &read);
    int resumed = TernTls_ConnectionResumed(connection);
    // A session stays resumable only after a clean close (OpenSSL drops it otherwise).
    SSL_shutdown(client.ssl);
    *next = SSL_get1_session(client.ssl);
    TernTls_ConnectionFree(connection);
    FreeClient(&client);
    return resumed;
}

static void Resumption_ReplicasSharingTicketKeys_ResumeEachOthersSessions(void)
{
    uint8_t keys[160];
    for (size_t i = 0; i < sizeof(keys); i++)
    {
        keys[i] = (uint8_t)i;
    }

    TernTlsServer* first = CreateServer();
    TernTlsServer* replica = CreateServer();
    TernTlsServer* stranger = CreateServer(); // its own random key
    CHECK(TernTls_ServerSetTicketKeys(first, keys, sizeof(keys)) == TERN_TLS_OK);
    // The replica has the same keys in another order: the older one still decrypts.
    uint8_t rotated[160];
    memcpy(rotated, keys + 80, 80);
    memcpy(rotated + 80, keys, 80);
    CHECK(TernTls_ServerSetTicketKeys(replica, rotated, sizeof(rotated)) == TERN_TLS_OK);
    CHECK(TernTls_ServerSetTicketKeys(first, keys, 79) == TERN_TLS_BAD_ARGUMENT);

    int versions[] = {TLS1_2_VERSION, TLS1_3_VERSION};
    for (int v = 0; v < 2; v++)
    {
        SSL_SESSION* session = NULL;
        SSL_SESSION* next = NULL;
        CHECK(HandshakeResumes(first, versions[v], NULL, &session) == 0);
        CHECK(HandshakeResumes(first, versions[v], session, &next) == 1);
        SSL_SESSION_free(next);
        CHECK(HandshakeResumes(replica, versions[v], session, &next) == 1);
        SSL_SESSION_free(next);
        CHECK(HandshakeResumes(stranger, versions[v], session, &next) == 0);
        SSL_SESSION_free(next);
        SSL_SESSION_free(session);
    }

    TernTls_ServerRelease(first);
    TernTls_ServerRelease(replica);
    TernTls_ServerRelease(stranger);
}

static int s_lastRefused;

// One handshake on server with the client's identity (may be NULL) and session (may be NULL).
// Returns whether it completed; *resumed and *next (if not NULL) tell about the session.
static const char* s_mutualServerName = "default.test";

static int MutualHandshake(TernTlsServer* server, int version, const Identity* identity, SSL_SESSION* session,
                           SSL_SESSION** next, int* resumed, char* reason, size_t reasonCapacity)
{
    Client client = NewClient(version, s_mutualServerName, "\x02h2", session);
    if (identity != NULL)
    {
        SSL_use_certificate(client.ssl, identity->certificate);
        SSL_use_PrivateKey(client.ssl, identity->key);
    }

    TernTlsConnection* connection = NULL;
    TernTls_ConnectionCreate(server, &connection);
    int completed = Handshake(&client, connection, 1 << 20, 16384, NULL);
    reason[0] = '\0';
    s_lastRefused = TernTls_ConnectionClientCertificateRefused(connection);
    if (!completed)
    {
        TernTls_ConnectionError(connection, reason, (int32_t)reasonCapacity);
    }
    else
    {
        // The certificate the server exposes is the one the client presented (DER), or none.
        int32_t needed = TernTls_ConnectionPeerCertificate(connection, NULL, 0);
        if (identity == NULL)
        {
            CHECK(needed == 0);
        }
        else
        {
            unsigned char* expected = NULL;
            int expectedLength = i2d_X509(identity->certificate, &expected);
            CHECK(needed == -expectedLength);
            uint8_t* der = malloc((size_t)expectedLength);
            CHECK(TernTls_ConnectionPeerCertificate(connection, der, expectedLength - 1) == -expectedLength);
            CHECK(TernTls_ConnectionPeerCertificate(connection, der, expectedLength) == expectedLength);
            CHECK(memcmp(der, expected, (size_t)expectedLength) == 0);
            free(der);
            OPENSSL_free(expected);
        }

        uint8_t byte;
        size_t read;
        SSL_read_ex(client.ssl, &byte, 1, &read); // TLS 1.3 tickets arrive after the handshake
        if (resumed != NULL)
        {
            *resumed = TernTls_ConnectionResumed(connection);
        }

        SSL_shutdown(client.ssl);
        if (next != NULL)
        {
            *next = SSL_get1_session(client.ssl);
        }
    }

    ERR_clear_error(); // the client's side of a refused handshake leaves errors on this thread
    TernTls_ConnectionFree(connection);
    FreeClient(&client);
    return completed;
}

static void ClientCertificates_RequiredAndOptional_VerifyAgainstTrustedCas(void)
{
    ClientPki pki = MakeClientPki(KeyP256);
    Identity trusted = pki.trusted, stranger = pki.stranger, server;
    server.certificate = MakeIssued("server.test", pki.authority.certificate, pki.authority.key, 2, KeyP256, &server.key);
    const char* caPem = pki.authorityPem;
    int caLength = pki.authorityPemLength;

    uint8_t keys[80] = {7};
    TernTlsServer* plain = CreateServer();
    TernTlsServer* required = CreateServer();
    TernTlsServer* optional = CreateServer();
    TernTls_ServerSetTicketKeys(plain, keys, sizeof(keys));
    TernTls_ServerSetTicketKeys(required, keys, sizeof(keys));
    TernTls_ServerSetTicketKeys(optional, keys, sizeof(keys));
    CHECK(TernTls_ServerSetClientCertificates(plain, TERN_TLS_CLIENT_CERTIFICATES_NONE, NULL, 0) == TERN_TLS_OK);
    CHECK(TernTls_ServerSetClientCertificates(required, TERN_TLS_CLIENT_CERTIFICATES_REQUIRED, (const uint8_t*)caPem, caLength) == TERN_TLS_OK);
    CHECK(TernTls_ServerSetClientCertificates(optional, TERN_TLS_CLIENT_CERTIFICATES_OPTIONAL, (const uint8_t*)caPem, caLength) == TERN_TLS_OK);
    CHECK(TernTls_ServerSetClientCertificates(optional, 3, (const uint8_t*)caPem, caLength) == TERN_TLS_BAD_ARGUMENT);
    CHECK(TernTls_ServerSetClientCertificates(optional, TERN_TLS_CLIENT_CERTIFICATES_REQUIRED, NULL, 0) == TERN_TLS_BAD_ARGUMENT);
    char reason[512];
    CHECK(TernTls_ServerSetClientCertificates(optional, TERN_TLS_CLIENT_CERTIFICATES_REQUIRED, (const uint8_t*)"no pem here", 11) == TERN_TLS_ERROR);
    CHECK(TernTls_LastErrorText(reason, sizeof(reason)) > 0);
    CHECK(TernTls_ServerSetClientCertificates(optional, TERN_TLS_CLIENT_CERTIFICATES_REQUIRED, (const uint8_t*)caPem, caLength / 2) == TERN_TLS_ERROR);
    TernTls_LastErrorText(reason, sizeof(reason));

    int versions[] = {TLS1_2_VERSION, TLS1_3_VERSION};
    for (int v = 0; v < 2; v++)
    {
        int resumed = -1;
        SSL_SESSION* session = NULL;
        SSL_SESSION* next = NULL;
        CHECK(MutualHandshake(required, versions[v], &trusted, NULL, &session, &resumed, reason, sizeof(reason)));
        CHECK(resumed == 0);
        // A resumed session still carries the client's certificate.
        CHECK(MutualHandshake(required, versions[v], &trusted, session, &next, &resumed, reason, sizeof(reason)));
        CHECK(resumed == 1);
        SSL_SESSION_free(next);
        SSL_SESSION_free(session);

        CHECK(!MutualHandshake(required, versions[v], NULL, NULL, NULL, NULL, reason, sizeof(reason)));
        CHECK(strstr(reason, "did not return a certificate") != NULL);
        CHECK(s_lastRefused == 1);
        CHECK(!MutualHandshake(required, versions[v], &stranger, NULL, NULL, NULL, reason, sizeof(reason)));
        CHECK(strstr(reason, "client certificate: unable to get local issuer certificate") != NULL);
        CHECK(s_lastRefused == 1);
        CHECK(!MutualHandshake(optional, versions[v], &stranger, NULL, NULL, NULL, reason, sizeof(reason)));
        // Issued by the trusted CA, but for servers only.
        CHECK(!MutualHandshake(required, versions[v], &server, NULL, NULL, NULL, reason, sizeof(reason)));
        CHECK(strstr(reason, "client certificate: unsuitable certificate purpose") != NULL);

        CHECK(MutualHandshake(optional, versions[v], NULL, NULL, NULL, NULL, reason, sizeof(reason)));
        CHECK(s_lastRefused == 0);
        CHECK(MutualHandshake(optional, versions[v], &trusted, NULL, NULL, NULL, reason, sizeof(reason)));

        // The same rules after SNI switched the connection to the second certificate's context.
        s_mutualServerName = "other.test";
        CHECK(!MutualHandshake(required, versions[v], NULL, NULL, NULL, NULL, reason, sizeof(reason)));
        CHECK(!MutualHandshake(required, versions[v], &stranger, NULL, NULL, NULL, reason, sizeof(reason)));
        CHECK(MutualHandshake(required, versions[v], &trusted, NULL, NULL, NULL, reason, sizeof(reason)));
        s_mutualServerName = "default.test";

        // Same ticket keys, other verification: a session from the server without mTLS does not
        // skip the certificate on the one that requires it (full handshake, which then fails).
        CHECK(MutualHandshake(plain, versions[v], NULL, NULL, &session, &resumed, reason, sizeof(reason)));
        CHECK(MutualHandshake(plain, versions[v], NULL, session, &next, &resumed, reason, sizeof(reason)) && resumed == 1);
        SSL_SESSION_free(next);
        CHECK(!MutualHandshake(required, versions[v], NULL, session, NULL, NULL, reason, sizeof(reason)));
        CHECK(MutualHandshake(optional, versions[v], NULL, session, &next, &resumed, reason, sizeof(reason)) && resumed == 0);
        SSL_SESSION_free(next);
        SSL_SESSION_free(session);
    }

    FreeClientPki(&pki);
    X509_free(server.certificate);
    EVP_PKEY_free(server.key);

    TernTls_ServerRelease(plain);
    TernTls_ServerRelease(required);
    TernTls_ServerRelease(optional);
}

static void Garbage_IsAnErrorWithReason(void)
{
    TernTlsServer* server = CreateServer();
    const char* inputs[] = {"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "\x16\x03\x01\xff\xff garbage that claims to be a huge ClientHello", "\x15\x03\x03\x00\x02\x02\x28"};
    for (size_t i = 0; i < sizeof(inputs) / sizeof(inputs[0]); i++)
    {
        TernTlsConnection* connection = NULL;
        TernTls_ConnectionCreate(server, &connection);
        uint8_t output[1024];
        TernTlsResult result;
        int32_t status = TernTls_Handshake(connection, (const uint8_t*)inputs[i], (int32_t)strlen(inputs[i]), output, sizeof(output), &result);
        CHECK(status == TERN_TLS_ERROR || status == TERN_TLS_WANT_READ);
        if (status == TERN_TLS_ERROR)
        {
            char reason[512];
            CHECK(TernTls_ConnectionError(connection, reason, sizeof(reason)) > 0);
        }

        TernTls_ConnectionFree(connection);
    }

    TernTlsResult result;
    CHECK(TernTls_Decrypt(NULL, NULL, 0, NULL, 0, &result) == TERN_TLS_BAD_ARGUMENT);
    {
        TernTlsConnection* connection = NULL;
        TernTls_ConnectionCreate(server, &connection);
        uint8_t byte = 0;
        result.status = TERN_TLS_OK;
        result.produced = 7;
        CHECK(TernTls_Decrypt(connection, &byte, 1, &byte, 0, &result) == TERN_TLS_BAD_ARGUMENT);
        CHECK(result.status == TERN_TLS_BAD_ARGUMENT && result.produced == 0);
        TernTls_ConnectionFree(connection);
    }
    CHECK(TernTls_Handshake(NULL, NULL, -1, NULL, 0, &result) == TERN_TLS_BAD_ARGUMENT);
    CHECK(TernTls_ServerAddCertificate(server, (const uint8_t*)"x", 1, (const uint8_t*)"y", 1) == TERN_TLS_ERROR);
    char reason[256];
    CHECK(TernTls_LastErrorText(reason, sizeof(reason)) > 0);
    CHECK(TernTls_ServerAddCertificate(server, (const uint8_t*)s_default.certificate, s_default.certificateLength, (const uint8_t*)s_other.key, s_other.keyLength) == TERN_TLS_ERROR);
    TernTls_LastErrorText(reason, sizeof(reason));
    TernTls_ServerRelease(server);
}

// Only elliptic-curve groups: a TLS 1.3 client offering finite-field ones alone is refused (ffdhe8192
// made one handshake cost the server about 90 ms of CPU), and one that offers them first is asked for
// a curve instead (a HelloRetryRequest). OpenSSL offers them over TLS 1.3 only.
static void Groups_FiniteFieldOnesAreRefused_CurvesNegotiate(void)
{
    TernTlsServer* server = CreateServer();
    {
        Client client = NewClient(TLS1_3_VERSION, "default.test", "\x02h2", NULL);
        CHECK(SSL_set1_groups_list(client.ssl, "ffdhe2048:ffdhe3072:ffdhe4096:ffdhe6144:ffdhe8192") == 1);
        TernTlsConnection* connection = NULL;
        TernTls_ConnectionCreate(server, &connection);
        CHECK(!Handshake(&client, connection, 1 << 20, 16384, NULL));
        char reason[512];
        CHECK(TernTls_ConnectionError(connection, reason, sizeof(reason)) > 0 && strstr(reason, "no suitable key share") != NULL);
        TernTls_ConnectionFree(connection);
        FreeClient(&client);
        ERR_clear_error();
    }

    // Each curve, and the curve a HelloRetryRequest asks for.
    const char* offered[] = {"X25519", "P-256", "P-384", "P-521", "ffdhe8192:X25519"};
    const int expected[] = {NID_X25519, NID_X9_62_prime256v1, NID_secp384r1, NID_secp521r1, NID_X25519};
    for (size_t i = 0; i < sizeof(offered) / sizeof(offered[0]); i++)
    {
        Client client = NewClient(TLS1_3_VERSION, "default.test", "\x02h2", NULL);
        CHECK(SSL_set1_groups_list(client.ssl, offered[i]) == 1);
        TernTlsConnection* connection = NULL;
        TernTls_ConnectionCreate(server, &connection);
        CHECK(Handshake(&client, connection, 1 << 20, 16384, NULL));
        CHECK(SSL_get_negotiated_group(client.ssl) == expected[i]);
        TernTls_ConnectionFree(connection);
        FreeClient(&client);
    }

    TernTls_ServerRelease(server);
}

// A peer that closes in the middle of a record must be told from one that closes between records.
static void PartialRecord_IsReportedUntilTheRestArrives(void)
{
    TernTlsServer* server = CreateServer();
    const int versions[] = {TLS1_2_VERSION, TLS1_3_VERSION};
    for (size_t v = 0; v < 2; v++)
    {
        Client client = NewClient(versions[v], NULL, NULL, NULL);
        TernTlsConnection* connection = NULL;
        TernTls_ConnectionCreate(server, &connection);
        CHECK(Handshake(&client, connection, 1 << 20, 16384, NULL));
        CHECK(TernTls_ConnectionPartialRecord(connection) == 0);

        const char request[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
        size_t written = 0;
        CHECK(SSL_write_ex(client.ssl, request, sizeof(request) - 1, &written) == 1);
        uint8_t* ciphertext = NULL;
        long length = BIO_get_mem_data(client.fromClient, (char**)&ciphertext);
        uint8_t plaintext[256];
        TernTlsResult result;
        // The header alone, then half the record, then the rest.
        const long cuts[] = {5, length / 2, length};
        long fed = 0;
        size_t total = 0;
        for (size_t c = 0; c < 3; c++)
        {
            int32_t status = TernTls_Decrypt(connection, ciphertext + fed, (int32_t)(cuts[c] - fed), plaintext + total, (int32_t)(sizeof(plaintext) - total), &result);
            CHECK(status == TERN_TLS_WANT_READ);
            fed += result.consumed;
            total += (size_t)result.produced;
            CHECK(TernTls_ConnectionPartialRecord(connection) == (c < 2));
        }

        CHECK(fed == length && total == sizeof(request) - 1 && memcmp(plaintext, request, total) == 0);
        (void)BIO_reset(client.fromClient);
        TernTls_ConnectionFree(connection);
        FreeClient(&client);
    }

    CHECK(TernTls_ConnectionPartialRecord(NULL) == 0);
    TernTls_ServerRelease(server);
}

// The client's TLS 1.2 write key and implicit IV for AES-128-GCM (RFC 5246 6.3, RFC 5288).
static int Tls12ClientKey(SSL* ssl, uint8_t key[16], uint8_t iv[4])
{
    uint8_t master[48];
    size_t masterLength = SSL_SESSION_get_master_key(SSL_get_session(ssl), master, sizeof(master));
    uint8_t seed[64];
    SSL_get_server_random(ssl, seed, 32);
    SSL_get_client_random(ssl, seed + 32, 32);
    EVP_KDF* kdf = EVP_KDF_fetch(NULL, "TLS1-PRF", NULL);
    EVP_KDF_CTX* context = EVP_KDF_CTX_new(kdf);
    char digest[] = "SHA256";
    char label[] = "key expansion";
    OSSL_PARAM params[] = {
        OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, digest, 0),
        OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_SECRET, master, masterLength),
        OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_SEED, label, strlen(label)),
        OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_SEED, seed, sizeof(seed)),
        OSSL_PARAM_construct_end(),
    };
    uint8_t block[40];
    int ok = EVP_KDF_derive(context, block, sizeof(block), params) == 1;
    EVP_KDF_CTX_free(context);
    EVP_KDF_free(kdf);
    memcpy(key, block, 16);    // client_write_key (the server's follows)
    memcpy(iv, block + 32, 4); // client_write_IV
    return ok;
}

// A TLS 1.2 AES-128-GCM handshake record carrying body, as the client sends it under sequence
// number seq: header, explicit nonce, ciphertext, tag. Returns its length.
static size_t SealHandshakeRecord(const uint8_t key[16], const uint8_t iv[4], uint64_t seq,
                                  const uint8_t* body, int length, uint8_t* out)
{
    uint8_t nonce[12];
    memcpy(nonce, iv, 4);
    for (int i = 0; i < 8; i++)
    {
        nonce[4 + i] = (uint8_t)(seq >> (56 - 8 * i));
    }

    // Additional data: sequence number, type, version, plaintext length.
    uint8_t aad[13] = {0, 0, 0, 0, 0, 0, 0, 0, 0x16, 0x03, 0x03, (uint8_t)(length >> 8), (uint8_t)length};
    memcpy(aad, nonce + 4, 8);
    int recordLength = 8 + length + 16;
    out[0] = 0x16;
    out[1] = 0x03;
    out[2] = 0x03;
    out[3] = (uint8_t)(recordLength >> 8);
    out[4] = (uint8_t)recordLength;
    memcpy(out + 5, nonce + 4, 8);
    EVP_CIPHER_CTX* cipher = EVP_CIPHER_CTX_new();
    int written = 0;
    int ok = EVP_EncryptInit_ex(cipher, EVP_aes_128_gcm(), NULL, key, nonce) == 1 &&
             EVP_EncryptUpdate(cipher, NULL, &written, aad, (int)sizeof(aad)) == 1 &&
             EVP_EncryptUpdate(cipher, out + 13, &written, body, length) == 1 &&
             EVP_EncryptFinal_ex(cipher, out + 13 + written, &written) == 1 &&
             EVP_CIPHER_CTX_ctrl(cipher, EVP_CTRL_GCM_GET_TAG, 16, out + 13 + length) == 1;
    EVP_CIPHER_CTX_free(cipher);
    CHECK(ok);
    return (size_t)(5 + recordLength);
}

// A TLS 1.2 peer that sends renegotiation attempts, each answered with a no_renegotiation alert,
// and never reads those alerts must not grow the spill buffer without bound.
static void UnreadAnswers_StopTheConnectionAtTheLimit(void)
{
    TernTlsServer* server = CreateServer();
    Client client = NewClient(TLS1_2_VERSION, NULL, NULL, NULL);
    CHECK(SSL_set_cipher_list(client.ssl, "ECDHE-ECDSA-AES128-GCM-SHA256") == 1);
    TernTlsConnection* connection = NULL;
    TernTls_ConnectionCreate(server, &connection);
    CHECK(Handshake(&client, connection, 1 << 20, 16384, NULL));
    uint8_t key[16];
    uint8_t iv[4];
    CHECK(Tls12ClientKey(client.ssl, key, iv));

    // An empty ClientHello: enough to draw the alert. The client's Finished was record 0.
    const uint8_t hello[] = {0x01, 0x00, 0x00, 0x00};
    uint8_t record[64];
    uint8_t plaintext[256];
    TernTlsResult result;
    memset(&result, 0, sizeof(result));
    int32_t status = TERN_TLS_WANT_READ;
    int records = 0;
    for (uint64_t seq = 1; seq <= 100000 && status == TERN_TLS_WANT_READ; seq++)
    {
        size_t length = SealHandshakeRecord(key, iv, seq, hello, (int)sizeof(hello), record);
        status = TernTls_Decrypt(connection, record, (int32_t)length, plaintext, sizeof(plaintext), &result);
        records++;
    }

    char reason[512] = {0};
    TernTls_ConnectionError(connection, reason, sizeof(reason));
    CHECK(status == TERN_TLS_ERROR);
    CHECK(strstr(reason, "does not read") != NULL);
    CHECK(result.consumed == 0 && result.pending > TERN_TLS_UNREAD_ANSWERS_LIMIT && result.pending < TERN_TLS_UNREAD_ANSWERS_LIMIT + 1024);
    CHECK(records > 1000 && records < 5000); // each record drew an alert of 31 bytes
    TernTls_ConnectionFree(connection);
    FreeClient(&client);
    TernTls_ServerRelease(server);
}

// Sends count KeyUpdates from the client and lets the server read them all: the answers (27 bytes
// each) go to the spill buffer, since Decrypt has no window for what OpenSSL writes. Returns the
// bytes waiting there.
static int32_t KeyUpdates(Client* client, TernTlsConnection* connection, int count)
{
    for (int i = 0; i < count; i++)
    {
        CHECK(SSL_key_update(client->ssl, SSL_KEY_UPDATE_REQUESTED) == 1);
        CHECK(SSL_do_handshake(client->ssl) == 1);
    }

    uint8_t* ciphertext = NULL;
    long length = BIO_get_mem_data(client->fromClient, (char**)&ciphertext);
    uint8_t plaintext[16];
    TernTlsResult result;
    CHECK(TernTls_Decrypt(connection, ciphertext, (int32_t)length, plaintext, sizeof(plaintext), &result) == TERN_TLS_WANT_READ);
    CHECK(result.consumed == length && result.produced == 0);
    (void)BIO_reset(client->fromClient);
    return result.pending;
}

// Moves at most window bytes of the spill buffer to the client; returns what is left there.
static int32_t DrainTo(Client* client, TernTlsConnection* connection, int32_t window)
{
    uint8_t output[512];
    TernTlsResult result;
    CHECK(TernTls_Encrypt(connection, NULL, 0, output, window, &result) >= 0);
    CHECK(result.produced <= window && result.drained == result.produced);
    BIO_write(client->toClient, output, result.produced);
    return result.pending;
}

// Answers pile up in the spill buffer, are drained in part, and more arrive: the buffer is
// compacted (the drained part dropped) or grown, and the client must still read every answer,
// in order. A byte lost or moved breaks its decryption of everything after it.
static void Spill_PartlyDrainedThenAppended_KeepsEveryByteInOrder(void)
{
    TernTlsServer* server = CreateServer();
    // The first bursts end just short of the buffer's first 4 KB (OpenSSL answers all but one,
    // 4,023 to 4,077 bytes), the last fills most of 8 KB; each drain leaves the start of the
    // buffer unused, and the next five answers do not fit behind the rest.
    const int bursts[] = {150, 151, 152, 300};
    const int32_t drains[] = {1, 26, 27, 400};
    for (size_t b = 0; b < sizeof(bursts) / sizeof(bursts[0]); b++)
    {
        for (size_t d = 0; d < sizeof(drains) / sizeof(drains[0]); d++)
        {
            Client client = NewClient(TLS1_3_VERSION, NULL, NULL, NULL);
            TernTlsConnection* connection = NULL;
            TernTls_ConnectionCreate(server, &connection);
            CHECK(Handshake(&client, connection, 1 << 20, 16384, NULL));
            int32_t waiting = KeyUpdates(&client, connection, bursts[b]);
            CHECK(waiting > 4000);
            CHECK(DrainTo(&client, connection, drains[d]) == waiting - drains[d]);
            KeyUpdates(&client, connection, 5);
            int32_t pending = 1;
            for (int round = 0; round < 2000 && pending > 0; round++)
            {
                pending = DrainTo(&client, connection, 7);
            }

            CHECK(pending == 0);
            // The client reads every answer, then both directions still work under the new keys.
            uint8_t byte = 0;
            size_t read = 0;
            CHECK(SSL_read_ex(client.ssl, &byte, 1, &read) == 0 && SSL_get_error(client.ssl, 0) == SSL_ERROR_WANT_READ);
            const char message[] = "after the updates";
            size_t written = 0;
            CHECK(SSL_write_ex(client.ssl, message, sizeof(message), &written) == 1);
            uint8_t* ciphertext = NULL;
            long length = BIO_get_mem_data(client.fromClient, (char**)&ciphertext);
            uint8_t plaintext[64];
            TernTlsResult result;
            CHECK(TernTls_Decrypt(connection, ciphertext, (int32_t)length, plaintext, sizeof(plaintext), &result) == TERN_TLS_WANT_READ);
            CHECK(result.produced == (int32_t)sizeof(message) && memcmp(plaintext, message, sizeof(message)) == 0);
            uint8_t output[256];
            CHECK(TernTls_Encrypt(connection, (const uint8_t*)message, sizeof(message), output, sizeof(output), &result) == TERN_TLS_OK);
            BIO_write(client.toClient, output, result.produced);
            char echoed[64];
            CHECK(SSL_read_ex(client.ssl, echoed, sizeof(echoed), &read) == 1 && read == sizeof(message));
            ERR_clear_error();
            TernTls_ConnectionFree(connection);
            FreeClient(&client);
        }
    }

    TernTls_ServerRelease(server);
}

// Bytes the process has allocated now (the sanitizer's count when it runs, else glibc's).
static size_t AllocatedBytes(void)
{
#if defined(__SANITIZE_ADDRESS__)
    return __sanitizer_get_current_allocated_bytes();
#else
    struct mallinfo2 info = mallinfo2();
    return info.uordblks;
#endif
}

static void RunConnections(TernTlsServer* server, int count)
{
    for (int i = 0; i < count; i++)
    {
        // Full TLS 1.2 and 1.3 handshakes, with and without SNI, each then carrying a little data.
        Client client = NewClient(i % 2 ? TLS1_3_VERSION : TLS1_2_VERSION, i % 3 ? "other.test" : NULL, "\x02h2", NULL);
        TernTlsConnection* connection = NULL;
        TernTls_ConnectionCreate(server, &connection);
        CHECK(Handshake(&client, connection, 1 << 20, 4096, NULL));
        uint8_t window[4096];
        TernTlsResult result;
        TernTls_Encrypt(connection, (const uint8_t*)"hello", 5, window, sizeof(window), &result);
        TernTls_ConnectionFree(connection);
        FreeClient(&client);
    }
}

static void TenThousandConnections_LeaveNoMemoryBehind(void)
{
    // LeakSanitizer fails the run on any leak; this also catches growth that is not a leak
    // (caches, buffers kept per connection): memory after 10,000 more connections must be
    // what it was after a warm-up.
    TernTlsServer* server = CreateServer();
    RunConnections(server, 500);
    size_t before = AllocatedBytes();
    RunConnections(server, 10000);
    size_t after = AllocatedBytes();
    printf("allocated bytes after warm-up %zu, after 10000 more connections %zu (growth %ld)\n", before, after, (long)after - (long)before);
    CHECK(after < before + 256 * 1024);
    TernTls_ServerRelease(server);
}

static void Version_IsOpenSsl3(void)
{
    CHECK(TernTls_AbiVersion() == TERN_TLS_ABI_VERSION);
    CHECK(TernTls_OpenSslVersionNumber() >= 0x30000000L);
    char text[8];
    char full[128];
    int32_t length = TernTls_OpenSslVersionText(full, sizeof(full));
    CHECK(length > 0 && strncmp(full, "OpenSSL 3", 9) == 0);
    CHECK(TernTls_OpenSslVersionText(text, sizeof(text)) == length && strlen(text) == sizeof(text) - 1);
    CHECK(TernTls_OpenSslVersionText(NULL, 10) == -1);
}

int main(void)
{
    s_default = MakeCertificate("default.test");
    s_other = MakeCertificate("other.test");
    Version_IsOpenSsl3();
    Handshakes_Tls12AndTls13_NegotiateProtocolAlpnAndSni();
    Handshake_NoSniAndHttp11Only_UsesDefaultCertificateAndHttp11();
    Handshake_OneByteInputsAndTinyOutputWindow_SpillsAndCompletes();
    Data_BothDirections_ArriveByteForByteAcrossSmallWindows();
    Resumption_ReplicasSharingTicketKeys_ResumeEachOthersSessions();
    ClientCertificates_RequiredAndOptional_VerifyAgainstTrustedCas();
    Garbage_IsAnErrorWithReason();
    Groups_FiniteFieldOnesAreRefused_CurvesNegotiate();
    PartialRecord_IsReportedUntilTheRestArrives();
    UnreadAnswers_StopTheConnectionAtTheLimit();
    Spill_PartlyDrainedThenAppended_KeepsEveryByteInOrder();
    TenThousandConnections_LeaveNoMemoryBehind();
    CHECK(s_selectorCalls > 0);
    FreePem(&s_default);
    FreePem(&s_other);
    if (failures != 0)
    {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }

    printf("tern_tls_tests: all checks passed\n");
    return 0;
}
