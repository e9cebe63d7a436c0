using System.Net;
using System.Security.Cryptography.X509Certificates;
using Tern.Tests.Infrastructure;

namespace Tern.Tests.Tls;

public abstract class TlsTests(string engine) : IAsyncLifetime
{
    private TestUpstream _upstream = null!;
    private TernInstance _tern = null!;

    public async Task InitializeAsync()
    {
        _upstream = await TestUpstream.StartAsync();
        var config = TernConfig.To(engine, _upstream).Certificates(
            ("default", TestPki.Localhost, []),
            ("a", TestPki.ATest, ["a.test"]),
            ("b", TestPki.BTest, ["B.Test"]),
            ("wild", TestPki.WildTest, ["*.wild.test"]),
            ("chained", TestPki.ChainedServer.Pair, ["chained.test"]));
        _tern = await TernInstance.StartAsync(config);
    }

    public async Task DisposeAsync()
    {
        await _tern.DisposeAsync();
        await _upstream.DisposeAsync();
    }

    [Theory]
    [InlineData("a.test", "a")]
    [InlineData("b.test", "b")]
    [InlineData("x.wild.test", "wild")]
    [InlineData("deep.x.wild.test", "default")]
    [InlineData("other.test", "default")]
    public async Task Sni_PicksCertificateByHost(string host, string expected)
    {
        X509Certificate2? seen = null;
        using var client = _tern.CreateClient(host: host, certificateSeen: c => seen = c);

        var name = await client.GetStringAsync(new Uri("/name", UriKind.Relative));

        Assert.Equal("up", name);
        Assert.Equal(Pki(expected).Thumbprint, seen!.Thumbprint);
    }

    [Theory]
    [InlineData("a.test", "a")]
    [InlineData("b.test", "b")]
    public async Task Sni_OpensslClient_ReceivesCertificateForServerName(string host, string expected)
    {
        var sent = await SentChainAsync(host);

        Assert.Equal(Pki(expected).Thumbprint, sent[0]);
    }

    /// <summary>
    /// A corrupted record from an HTTP/2 client after the handshake ends that connection with a
    /// Debug line. On the SslStream engine it also made Kestrel log "Unhandled exception while
    /// processing" with a stack trace; its other error line, from Kestrel's HTTP/2 flusher, is a
    /// known limit (README).
    /// </summary>
    [Fact]
    public async Task CorruptedRecordOverHttp2_IsNotAnUnhandledException()
    {
        await using var client = await RawHttp.ConnectAsync(_tern.Config.HttpsPort, http2: true);

        // An application-data record whose contents no key made.
        var record = new byte[5 + 64];
        record[0] = 0x17;
        record[1] = 0x03;
        record[2] = 0x03;
        record[4] = 64;
        System.Security.Cryptography.RandomNumberGenerator.Fill(record.AsSpan(5));
        await client.Socket.SendAsync(record);
        await SocketReads.UntilClosedAsync(client.Socket);

        await _tern.Logs.WaitForAsync(" closed: ");
        await Task.Delay(300);
        Assert.DoesNotContain(_tern.Logs.Lines, l => l.Contains("Unhandled exception while processing", StringComparison.Ordinal));
    }

    [Fact]
    public async Task ServerChain_IntermediatesInTheFileAreSent_ALoneLeafGoesAlone()
    {
        var (chained, intermediate) = TestPki.ChainedServer;

        Assert.Equal([chained.Thumbprint, intermediate], await SentChainAsync("chained.test"));
        Assert.Equal([TestPki.ATest.Thumbprint], await SentChainAsync("a.test"));
    }

    [Theory]
    [InlineData("--http1.1", "HTTP/1.1")]
    [InlineData("--http2", "HTTP/2")]
    public async Task Curl_ThroughTls_GetsUpstreamResponse(string flag, string expectedVersion)
    {
        var (exit, output) = await Tool.RunAsync("curl", ["-sS", "-k", flag, "-i", "--resolve", $"a.test:{_tern.Config.HttpsPort}:127.0.0.1", $"https://a.test:{_tern.Config.HttpsPort}/name"]);

        Assert.Equal(0, exit);
        Assert.StartsWith($"{expectedVersion} 200", output, StringComparison.Ordinal);
        Assert.EndsWith("up", output, StringComparison.Ordinal);
    }

    [Fact]
    public async Task Curl_PostsBody_UpstreamEchoesIt()
    {
        var (exit, output) = await Tool.RunAsync("curl", ["-sS", "-k", "--data-binary", "tern says hello", $"https://127.0.0.1:{_tern.Config.HttpsPort}/echo"]);

        Assert.Equal(0, exit);
        Assert.Equal("tern says hello", output);
    }

    [Theory]
    [InlineData("-tls1_2", "TLSv1.2")]
    [InlineData("-tls1_3", "TLSv1.3")]
    public async Task Openssl_ModernProtocols_AreNegotiated(string flag, string protocol)
    {
        var (exit, output) = await Tool.RunAsync("openssl", ["s_client", "-connect", $"127.0.0.1:{_tern.Config.HttpsPort}", flag, "-servername", "a.test"], input: "Q\n");

        Assert.Equal(0, exit);
        Assert.Contains($"New, {protocol}, Cipher is", output, StringComparison.Ordinal);
    }

    [Fact]
    public async Task Openssl_Tls10_IsRefused()
    {
        var (exit, output) = await Tool.RunAsync("openssl", ["s_client", "-connect", $"127.0.0.1:{_tern.Config.HttpsPort}", "-tls1", "-cipher", "DEFAULT@SECLEVEL=0"], input: "Q\n");

        Assert.NotEqual(0, exit);
        Assert.Contains("alert protocol version", output, StringComparison.Ordinal);
        using var client = _tern.CreateClient();
        Assert.Equal(HttpStatusCode.OK, (await client.GetAsync(new Uri("/name", UriKind.Relative))).StatusCode);
    }

    [Theory]
    [InlineData(0)] // GET
    [InlineData(1024 * 1024)] // a POST whose body is still coming when the answer goes out
    public async Task PlainHttpOnTheHttpsPort_Gets400SayingSo(int bodyLength)
    {
        var body = Path.GetTempFileName();
        await File.WriteAllBytesAsync(body, new byte[bodyLength]);
        string[] post = bodyLength > 0 ? ["--data-binary", $"@{body}"] : [];
        var after = _tern.Logs.Count;

        var (exit, output) = await Tool.RunAsync("curl", ["-sS", "-i", .. post, $"http://127.0.0.1:{_tern.Config.HttpsPort}/name"]);
        File.Delete(body);

        Assert.True(exit == 0, output);
        Assert.StartsWith("HTTP/1.1 400 Bad Request", output, StringComparison.Ordinal);
        Assert.EndsWith("the request came as plain HTTP; use https://\n", output, StringComparison.Ordinal);
        await _tern.Logs.WaitForAsync("a plain HTTP request on the HTTPS port (answered 400)", after: after);
        AssertNoWarningOrError();
    }

    [Theory]
    [InlineData("GE", "T /name HTTP/1.1\r\nHost: localhost\r\n\r\n")] // the method in two segments
    [InlineData("GET /\r\n", "")] // HTTP/0.9's request, 7 bytes
    public async Task PlainHttpInPiecesOrShort_Gets400(string first, string rest)
    {
        using var socket = new System.Net.Sockets.Socket(System.Net.Sockets.SocketType.Stream, System.Net.Sockets.ProtocolType.Tcp);
        socket.NoDelay = true;
        await socket.ConnectAsync(IPAddress.Loopback, _tern.Config.HttpsPort);
        await socket.SendAsync(System.Text.Encoding.ASCII.GetBytes(first));
        await Task.Delay(200);
        await socket.SendAsync(System.Text.Encoding.ASCII.GetBytes(rest));

        var answer = await SocketReads.UntilClosedAsync(socket);

        Assert.StartsWith("HTTP/1.1 400 Bad Request", System.Text.Encoding.ASCII.GetString(answer), StringComparison.Ordinal);
    }

    [Fact]
    public async Task HandshakeStartedLate_EndsAtTheTimeoutCountedFromTheAccept()
    {
        var config = TernConfig.To(engine, _upstream);
        config.Tls["HandshakeTimeout"] = "00:00:03";
        await using var tern = await TernInstance.StartAsync(config);
        using var socket = new System.Net.Sockets.Socket(System.Net.Sockets.SocketType.Stream, System.Net.Sockets.ProtocolType.Tcp);
        await socket.ConnectAsync(IPAddress.Loopback, tern.Config.HttpsPort);
        var started = System.Diagnostics.Stopwatch.StartNew();

        // Silent until just before the deadline, then the start of a handshake record, and no more.
        await Task.Delay(TimeSpan.FromSeconds(2.6));
        await socket.SendAsync(new byte[] { 0x16, 0x03, 0x01 });
        await SocketReads.UntilClosedAsync(socket, TimeSpan.FromSeconds(15));

        // With a second timeout counted from the first byte, the SslStream engine closed it at 5.6 s.
        Assert.True(started.Elapsed < TimeSpan.FromSeconds(3.9), $"closed after {started.Elapsed}");
    }

    public static TheoryData<string, string> NotAHello() => new()
    {
        { "empty handshake records", "1603010000160301000016030100001603010000" },
        { "garbage", "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff" },
        { "an alert before the hello", "15030100020228" },
        { "SSLv2 hello", "802b0103010012000000100100800700c0030080060040040080020080" },
    };

    [Theory]
    [MemberData(nameof(NotAHello))]
    public async Task FirstBytesNotAClientHello_CloseTheConnection_WithoutAWarning(string what, string hex)
    {
        using var socket = new System.Net.Sockets.Socket(System.Net.Sockets.SocketType.Stream, System.Net.Sockets.ProtocolType.Tcp);
        await socket.ConnectAsync(IPAddress.Loopback, _tern.Config.HttpsPort);
        await socket.SendAsync(Convert.FromHexString(hex));
        socket.Shutdown(System.Net.Sockets.SocketShutdown.Send);

        // An alert or nothing, then the close. (SslStream took some of these for a missing
        // certificate, and Kestrel logged that as an error with a stack trace.)
        var answer = await SocketReads.UntilClosedAsync(socket);

        Assert.True(answer is [] or [0x15, ..], $"{what}: {Convert.ToHexString(answer)}");
        await Task.Delay(300); // Kestrel logs what escapes a connection after closing it
        AssertNoWarningOrError();
        using var client = _tern.CreateClient();
        Assert.Equal("up", await client.GetStringAsync(new Uri("/name", UriKind.Relative)));
    }

    private void AssertNoWarningOrError() =>
        Assert.DoesNotContain(_tern.Logs.Lines, l => l.StartsWith("Warning:", StringComparison.Ordinal) || l.StartsWith("Error:", StringComparison.Ordinal) || l.StartsWith("Critical:", StringComparison.Ordinal));

    [Fact]
    public async Task NoCertificateConfigured_GeneratesSelfSignedOnceAndKeepsIt()
    {
        var folder = Directory.CreateTempSubdirectory("tern-selfsigned-").FullName;
        var config = TernConfig.To(engine, _upstream);
        config.Tls.Remove("Certificates");
        config.Tls["SelfSignedDirectory"] = folder;

        string first;
        await using (var tern = await TernInstance.StartAsync(config))
        {
            X509Certificate2? seen = null;
            using var client = tern.CreateClient(certificateSeen: c => seen = c);
            Assert.Equal("up", await client.GetStringAsync(new Uri("/name", UriKind.Relative)));
            Assert.Equal("CN=localhost", seen!.Subject);
            first = seen.Thumbprint;
        }

        var again = TernConfig.To(engine, _upstream);
        again.Tern["Tls"] = config.Tls.DeepClone();
        await using (var tern = await TernInstance.StartAsync(again))
        {
            X509Certificate2? seen = null;
            using var client = tern.CreateClient(certificateSeen: c => seen = c);
            await client.GetStringAsync(new Uri("/name", UriKind.Relative));
            Assert.Equal(first, seen!.Thumbprint);
        }
    }

    /// <summary>The thumbprints of the certificates the server sent for this name, in order (openssl s_client -showcerts).</summary>
    private async Task<string[]> SentChainAsync(string host)
    {
        var (exit, output) = await Tool.RunAsync("openssl", ["s_client", "-connect", $"127.0.0.1:{_tern.Config.HttpsPort}", "-servername", host, "-showcerts"], input: "Q\n");
        Assert.Equal(0, exit);

        const string Begin = "-----BEGIN CERTIFICATE-----", End = "-----END CERTIFICATE-----";
        var sent = new List<string>();
        for (var at = output.IndexOf(Begin, StringComparison.Ordinal); at >= 0; at = output.IndexOf(Begin, at + 1, StringComparison.Ordinal))
        {
            using var certificate = X509Certificate2.CreateFromPem(output.AsSpan(at, output.IndexOf(End, at, StringComparison.Ordinal) + End.Length - at));
            sent.Add(certificate.Thumbprint);
        }

        return [.. sent];
    }

    private static PemPair Pki(string name) => name switch
    {
        "a" => TestPki.ATest,
        "b" => TestPki.BTest,
        "wild" => TestPki.WildTest,
        _ => TestPki.Localhost,
    };
}

public sealed class OpenSslTlsTests() : TlsTests(Proxy.Tls.TlsEngines.OpenSsl);

public sealed class SslStreamTlsTests() : TlsTests(Proxy.Tls.TlsEngines.SslStream);
