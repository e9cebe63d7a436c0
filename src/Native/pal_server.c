// Server side configuration: one SSL_CTX per certificate, created once and
// reused by every connection (OpenSSL 3 is slow when algorithms are fetched
// per connection); SNI switches the connection to the chosen context.
#include "pal_internal.h"

#include <openssl/core_names.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/sha.h>
#include <openssl/x509v3.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define TICKET_KEY_SIZE 80

// Modern TLS 1.2 suites (forward secret AEAD only); TLS 1.3 keeps OpenSSL's defaults.
static const char s_tls12Ciphers[] =
    "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:"
    "ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:"
    "ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305";

// Key exchange groups: the hybrid with ML-KEM where this OpenSSL has it (3.5 and later), then the
// elliptic curves browsers and Go offer. This order decides over TLS 1.2 and which group a
// HelloRetryRequest asks for; over TLS 1.3 OpenSSL 3.0 takes the client's first key share that is
// on the list. OpenSSL 3.0's own list also offers the finite-field groups ffdhe2048 to ffdhe8192
// (TLS 1.3 only), so any client could make Tern spend about 90 ms of CPU on one ffdhe8192
// handshake, against about 1 ms for a whole connection with X25519 (README): a denial of service
// for the price of a ClientHello. The dearest group left is P-384, about 2.5 times X25519's
// connection.
static const char* const s_groups[] = {"X25519MLKEM768", "X25519", "P-256", "P-384", "P-521"};

// Sets the groups of s_groups this OpenSSL knows (3.0 fails the whole list for one unknown name).
static int SetGroups(SSL_CTX* context)
{
    char list[128];
    size_t length = 0;
    for (size_t i = 0; i < sizeof(s_groups) / sizeof(s_groups[0]); i++)
    {
        ERR_set_mark();
        int known = SSL_CTX_set1_groups_list(context, s_groups[i]) == 1;
        ERR_pop_to_mark();
        size_t size = strlen(s_groups[i]);
        if (known && length + size + 2 <= sizeof(list))
        {
            if (length > 0)
            {
                list[length++] = ':';
            }

            memcpy(list + length, s_groups[i], size);
            length += size;
        }
    }

    list[length] = '\0';
    if (length == 0)
    {
        ERR_raise_data(ERR_LIB_SSL, SSL_R_NO_SUITABLE_GROUPS, "none of X25519, P-256, P-384 or P-521 is available");
        return 0;
    }

    return SSL_CTX_set1_groups_list(context, list) == 1;
}

static int ServerNameCallback(SSL* ssl, int* alert, void* arg)
{
    (void)alert;
    TernTlsServer* server = arg;
    if (server->selector == NULL || server->count < 2)
    {
        return SSL_TLSEXT_ERR_OK;
    }

    const char* name = SSL_get_servername(ssl, TLSEXT_NAMETYPE_host_name);
    size_t length = name == NULL ? 0 : strlen(name);
    int32_t index = server->selector(server->selectorState, name, length > 255 ? 255 : (int32_t)length);
    if (index > 0 && index < server->count)
    {
        SSL_set_SSL_CTX(ssl, server->contexts[index]);
    }

    return SSL_TLSEXT_ERR_OK;
}

static int AlpnCallback(SSL* ssl, const unsigned char** out, unsigned char* outLength,
                        const unsigned char* in, unsigned int inLength, void* arg)
{
    (void)ssl;
    TernTlsServer* server = arg;
    unsigned char* selected = NULL;
    if (server->alpnLength > 0 &&
        SSL_select_next_proto(&selected, outLength, server->alpn, (unsigned int)server->alpnLength, in, inLength) == OPENSSL_NPN_NEGOTIATED)
    {
        *out = selected;
        return SSL_TLSEXT_ERR_OK;
    }

    // No protocol in common: carry on without ALPN (HTTP/1.1), as browsers expect.
    return SSL_TLSEXT_ERR_NOACK;
}

static int SetTicketKeyParameters(EVP_MAC_CTX* hmac, const uint8_t* key)
{
    OSSL_PARAM parameters[3];
    parameters[0] = OSSL_PARAM_construct_octet_string(OSSL_MAC_PARAM_KEY, (void*)(key + 48), 32);
    parameters[1] = OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, (char*)"SHA256", 0);
    parameters[2] = OSSL_PARAM_construct_end();
    return EVP_MAC_CTX_set_params(hmac, parameters);
}

static int TicketKeyCallback(SSL* ssl, unsigned char keyName[16], unsigned char* iv,
                             EVP_CIPHER_CTX* cipher, EVP_MAC_CTX* hmac, int encrypt)
{
    TernTlsServer* server = SSL_CTX_get_app_data(SSL_get_SSL_CTX(ssl));
    if (server == NULL || server->ticketKeyCount == 0)
    {
        return 0;
    }

    if (encrypt)
    {
        const uint8_t* key = server->ticketKeys;
        memcpy(keyName, key, 16);
        if (RAND_bytes(iv, 16) != 1 ||
            EVP_EncryptInit_ex(cipher, EVP_aes_256_cbc(), NULL, key + 16, iv) != 1 ||
            SetTicketKeyParameters(hmac, key) != 1)
        {
            return -1;
        }

        return 1;
    }

    for (int32_t i = 0; i < server->ticketKeyCount; i++)
    {
        const uint8_t* key = server->ticketKeys + (size_t)i * TICKET_KEY_SIZE;
        if (memcmp(keyName, key, 16) == 0)
        {
            if (EVP_DecryptInit_ex(cipher, EVP_aes_256_cbc(), NULL, key + 16, iv) != 1 ||
                SetTicketKeyParameters(hmac, key) != 1)
            {
                return -1;
            }

            // A ticket under an older key is accepted and renewed under the current one.
            return i == 0 ? 1 : 2;
        }
    }

    return 0; // unknown key: full handshake
}

int32_t TernTls_ServerCreate(const uint8_t* alpn, int32_t alpnLength,
                             TernTlsCertificateSelector selector, void* state,
                             TernTlsServer** server)
{
    if (server == NULL || alpnLength < 0 || alpnLength > 255 || (alpnLength > 0 && alpn == NULL))
    {
        return TERN_TLS_BAD_ARGUMENT;
    }

    *server = NULL;
    TernTlsServer* created = calloc(1, sizeof(TernTlsServer));
    if (created == NULL)
    {
        return TERN_TLS_NO_MEMORY;
    }

    if (alpnLength > 0)
    {
        created->alpn = malloc((size_t)alpnLength);
        if (created->alpn == NULL)
        {
            free(created);
            return TERN_TLS_NO_MEMORY;
        }

        memcpy(created->alpn, alpn, (size_t)alpnLength);
        created->alpnLength = alpnLength;
    }

    // One random ticket key until the caller loads shared ones: every SNI context of this
    // server then encrypts and decrypts tickets alike.
    created->ticketKeys = malloc(TICKET_KEY_SIZE);
    if (created->ticketKeys == NULL || RAND_bytes(created->ticketKeys, TICKET_KEY_SIZE) != 1)
    {
        free(created->ticketKeys);
        free(created->alpn);
        free(created);
        return TERN_TLS_NO_MEMORY;
    }

    created->ticketKeyCount = 1;
    created->selector = selector;
    created->selectorState = state;
    atomic_init(&created->references, 1);
    *server = created;
    return TERN_TLS_OK;
}

static SSL_CTX* CreateContext(TernTlsServer* server)
{
    SSL_CTX* context = SSL_CTX_new(TLS_server_method());
    if (context == NULL)
    {
        return NULL;
    }

    SSL_CTX_set_app_data(context, server);
    if (SSL_CTX_set_min_proto_version(context, TLS1_2_VERSION) != 1 ||
        SSL_CTX_set_max_proto_version(context, TLS1_3_VERSION) != 1 ||
        SSL_CTX_set_cipher_list(context, s_tls12Ciphers) != 1 || !SetGroups(context) ||
        SSL_CTX_set_session_id_context(context, (const unsigned char*)"tern", 4) != 1)
    {
        SSL_CTX_free(context);
        return NULL;
    }

    SSL_CTX_set_options(context, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE);
    // No automatic chain: the certificate file's own intermediates are the chain sent. Without this
    // flag, a leaf with no intermediates makes OpenSSL build a chain from the context's store (which
    // holds nothing) on every full handshake: an X509_verify_cert per handshake that adds nothing.
    SSL_CTX_set_mode(context, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER | SSL_MODE_RELEASE_BUFFERS |
                                  SSL_MODE_NO_AUTO_CHAIN);
    // Read-ahead stays off: the caller must know exactly how much ciphertext was taken.
    SSL_CTX_set_read_ahead(context, 0);
    // Resumption is by ticket only (keys replicas can share); a server-side cache would grow with
    // every full TLS 1.2 handshake and help no other replica.
    SSL_CTX_set_session_cache_mode(context, SSL_SESS_CACHE_OFF);
    SSL_CTX_set_tlsext_servername_callback(context, ServerNameCallback);
    SSL_CTX_set_tlsext_servername_arg(context, server);
    SSL_CTX_set_alpn_select_cb(context, AlpnCallback, server);
    SSL_CTX_set_tlsext_ticket_key_evp_cb(context, TicketKeyCallback);
    return context;
}

static int LoadCertificate(SSL_CTX* context, const uint8_t* certificatePem, int32_t certificateLength,
                           const uint8_t* keyPem, int32_t keyLength)
{
    int ok = 0;
    BIO* certificates = BIO_new_mem_buf(certificatePem, certificateLength);
    BIO* keys = BIO_new_mem_buf(keyPem, keyLength);
    X509* leaf = NULL;
    EVP_PKEY* key = NULL;
    if (certificates == NULL || keys == NULL)
    {
        goto done;
    }

    leaf = PEM_read_bio_X509_AUX(certificates, NULL, NULL, NULL);
    if (leaf == NULL || SSL_CTX_use_certificate(context, leaf) != 1)
    {
        goto done;
    }

    X509* intermediate;
    while ((intermediate = PEM_read_bio_X509(certificates, NULL, NULL, NULL)) != NULL)
    {
        if (SSL_CTX_add0_chain_cert(context, intermediate) != 1)
        {
            X509_free(intermediate);
            goto done;
        }
    }

    ERR_clear_error(); // the loop ends on "no start line", which is not a failure

    key = PEM_read_bio_PrivateKey(keys, NULL, NULL, NULL);
    ok = key != NULL && SSL_CTX_use_PrivateKey(context, key) == 1 && SSL_CTX_check_private_key(context) == 1;

done:
    X509_free(leaf);
    EVP_PKEY_free(key);
    BIO_free(certificates);
    BIO_free(keys);
    return ok;
}

int32_t TernTls_ServerAddCertificate(TernTlsServer* server,
                                     const uint8_t* certificatePem, int32_t certificateLength,
                                     const uint8_t* keyPem, int32_t keyLength)
{
    if (server == NULL || certificatePem == NULL || certificateLength <= 0 || keyPem == NULL || keyLength <= 0)
    {
        return TERN_TLS_BAD_ARGUMENT;
    }

    ERR_clear_error();
    if (server->count == server->capacity)
    {
        int32_t capacity = server->capacity == 0 ? 4 : server->capacity * 2;
        SSL_CTX** grown = realloc(server->contexts, (size_t)capacity * sizeof(SSL_CTX*));
        if (grown == NULL)
        {
            return TERN_TLS_NO_MEMORY;
        }

        server->contexts = grown;
        server->capacity = capacity;
    }

    SSL_CTX* context = CreateContext(server);
    if (context == NULL)
    {
        return TERN_TLS_ERROR;
    }

    if (!LoadCertificate(context, certificatePem, certificateLength, keyPem, keyLength))
    {
        SSL_CTX_free(context);
        return TERN_TLS_ERROR;
    }

    server->contexts[server->count] = context;
    return server->count++;
}

// Reads every certificate of a PEM bundle into a verification store and the list of names
// sent to clients. Returns the number read, or -1 on a parse failure.
static int ReadAuthorities(const uint8_t* pem, int32_t length, X509_STORE* store, STACK_OF(X509_NAME) * names)
{
    BIO* bio = BIO_new_mem_buf(pem, length);
    if (bio == NULL)
    {
        return -1;
    }

    int count = 0;
    X509* authority;
    while ((authority = PEM_read_bio_X509(bio, NULL, NULL, NULL)) != NULL)
    {
        X509_NAME* name = X509_NAME_dup(X509_get_subject_name(authority));
        int added = X509_STORE_add_cert(store, authority) == 1 && name != NULL && sk_X509_NAME_push(names, name) > 0;
        X509_free(authority);
        if (!added)
        {
            X509_NAME_free(name);
            BIO_free(bio);
            return -1;
        }

        count++;
    }

    BIO_free(bio);
    // The loop ends on "no start line"; anything else is a damaged bundle.
    unsigned long last = ERR_peek_last_error();
    if (count == 0 || (last != 0 && ERR_GET_REASON(last) != PEM_R_NO_START_LINE))
    {
        return -1;
    }

    ERR_clear_error();
    return count;
}

int32_t TernTls_ServerSetClientCertificates(TernTlsServer* server, int32_t mode,
                                            const uint8_t* caPem, int32_t caLength)
{
    if (server == NULL || server->count == 0 || mode < TERN_TLS_CLIENT_CERTIFICATES_NONE ||
        mode > TERN_TLS_CLIENT_CERTIFICATES_REQUIRED ||
        (mode != TERN_TLS_CLIENT_CERTIFICATES_NONE && (caPem == NULL || caLength <= 0)))
    {
        return TERN_TLS_BAD_ARGUMENT;
    }

    if (mode == TERN_TLS_CLIENT_CERTIFICATES_NONE)
    {
        return TERN_TLS_OK;
    }

    ERR_clear_error();
    int32_t status = TERN_TLS_ERROR;
    X509_STORE* store = X509_STORE_new();
    STACK_OF(X509_NAME)* names = sk_X509_NAME_new_null();
    if (store == NULL || names == NULL)
    {
        status = TERN_TLS_NO_MEMORY;
        goto done;
    }

    if (ReadAuthorities(caPem, caLength, store, names) <= 0)
    {
        if (ERR_peek_error() == 0)
        {
            ERR_raise_data(ERR_LIB_SSL, ERR_R_PASSED_INVALID_ARGUMENT, "no CA certificate in the bundle");
        }

        goto done;
    }

    // A session carries the client's verified identity: it must not resume under another mode or
    // another set of CAs (a ticket issued without mTLS would otherwise skip it after a reload).
    unsigned char context[SHA256_DIGEST_LENGTH];
    EVP_MD_CTX* digest = EVP_MD_CTX_new();
    unsigned char modeByte = (unsigned char)mode;
    int hashed = digest != NULL && EVP_DigestInit_ex(digest, EVP_sha256(), NULL) == 1 &&
                 EVP_DigestUpdate(digest, "tern-mtls", 9) == 1 && EVP_DigestUpdate(digest, &modeByte, 1) == 1 &&
                 EVP_DigestUpdate(digest, caPem, (size_t)caLength) == 1 && EVP_DigestFinal_ex(digest, context, NULL) == 1;
    EVP_MD_CTX_free(digest);
    if (!hashed)
    {
        goto done;
    }

    int verify = SSL_VERIFY_PEER | (mode == TERN_TLS_CLIENT_CERTIFICATES_REQUIRED ? SSL_VERIFY_FAIL_IF_NO_PEER_CERT : 0);
    for (int32_t i = 0; i < server->count; i++)
    {
        SSL_CTX* ctx = server->contexts[i];
        STACK_OF(X509_NAME)* copy = SSL_dup_CA_list(names);
        if (copy == NULL)
        {
            goto done;
        }

        SSL_CTX_set_client_CA_list(ctx, copy);
        if (SSL_CTX_set1_verify_cert_store(ctx, store) != 1 ||
            SSL_CTX_set_purpose(ctx, X509_PURPOSE_SSL_CLIENT) != 1 ||
            SSL_CTX_set_session_id_context(ctx, context, sizeof(context)) != 1)
        {
            goto done;
        }

        SSL_CTX_set_verify(ctx, verify, NULL);
        SSL_CTX_set_verify_depth(ctx, 8);
    }

    status = TERN_TLS_OK;

done:
    sk_X509_NAME_pop_free(names, X509_NAME_free);
    X509_STORE_free(store);
    return status;
}

int32_t TernTls_ServerSetTicketKeys(TernTlsServer* server, const uint8_t* keys, int32_t length)
{
    if (server == NULL || keys == NULL || length <= 0 || length % TICKET_KEY_SIZE != 0)
    {
        return TERN_TLS_BAD_ARGUMENT;
    }

    uint8_t* copy = malloc((size_t)length);
    if (copy == NULL)
    {
        return TERN_TLS_NO_MEMORY;
    }

    memcpy(copy, keys, (size_t)length);
    if (server->ticketKeys != NULL)
    {
        OPENSSL_cleanse(server->ticketKeys, (size_t)server->ticketKeyCount * TICKET_KEY_SIZE);
        free(server->ticketKeys);
    }

    server->ticketKeys = copy;
    server->ticketKeyCount = length / TICKET_KEY_SIZE;
    return TERN_TLS_OK;
}

void TernServerRetain(TernTlsServer* server)
{
    atomic_fetch_add(&server->references, 1);
}

void TernTls_ServerRelease(TernTlsServer* server)
{
    if (server == NULL || atomic_fetch_sub(&server->references, 1) != 1)
    {
        return;
    }

    for (int32_t i = 0; i < server->count; i++)
    {
        SSL_CTX_free(server->contexts[i]);
    }

    if (server->ticketKeys != NULL)
    {
        OPENSSL_cleanse(server->ticketKeys, (size_t)server->ticketKeyCount * TICKET_KEY_SIZE);
        free(server->ticketKeys);
    }

    free(server->contexts);
    free(server->alpn);
    free(server);
}
