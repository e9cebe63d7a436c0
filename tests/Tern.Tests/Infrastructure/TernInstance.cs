using System.Net;
using System.Net.Sockets;
using System.Security.Cryptography.X509Certificates;
using Tern.Proxy;

namespace Tern.Tests.Infrastructure;

/// <summary>A real Tern (Kestrel + TLS + YARP) started in the test process on loopback ports.</summary>
public sealed class TernInstance : IAsyncDisposable
{
    private readonly WebApplication _app;

    private TernInstance(WebApplication app, TernConfig config, string folder, LogCapture logs)
    {
        _app = app;
        Config = config;
        Folder = folder;
        Logs = logs;
    }

    /// <summary>What this Tern logged (Tern's own lines at Information and up, everyone's warnings).</summary>
    public LogCapture Logs { get; }

    public TernConfig Config { get; }

    /// <summary>The content root; its config/appsettings.json is the file the proxy watches.</summary>
    public string Folder { get; }

    public IServiceProvider Services => _app.Services;

    /// <param name="config">The settings.</param>
    /// <param name="options">Changes to the host options.</param>
    /// <param name="built">Run after Tern has loaded its configuration and before it starts.</param>
    public static async Task<TernInstance> StartAsync(TernConfig config, Func<TernHostOptions, TernHostOptions>? options = null, Func<Task>? built = null)
    {
        var folder = Directory.CreateTempSubdirectory("tern-test-").FullName;
        Directory.CreateDirectory(Path.Combine(folder, "config"));
        await File.WriteAllTextAsync(Path.Combine(folder, "config", "appsettings.json"), config.ToJson());
        var errors = new StringWriter();
        var logs = new LogCapture();
        var hostOptions = new TernHostOptions { ContentRoot = folder, EnvironmentName = "Test", Logging = l => l.AddProvider(logs) };
        var app = TernHost.TryBuild(options?.Invoke(hostOptions) ?? hostOptions, errors)
            ?? throw new InvalidOperationException($"Tern did not build:\n{errors}");
        if (built is not null)
        {
            await built();
        }

        await app.StartAsync();
        return new TernInstance(app, config, folder, logs);
    }

    /// <summary>Replaces the watched settings file, as an operator editing it would.</summary>
    public Task RewriteConfigAsync(string json) => File.WriteAllTextAsync(Path.Combine(Folder, "config", "appsettings.json"), json);

    public HttpClient CreateClient(string host = "localhost", Version? version = null, Action<X509Certificate2>? certificateSeen = null, X509Certificate2? clientCertificate = null) =>
        CreateClient(Config.HttpsPort, "https", host, version, certificateSeen, clientCertificate);

    public HttpClient CreatePlainClient(int port, string host = "localhost") => CreateClient(port, "http", host, null, null);

    /// <summary>
    /// A client that resolves every host name to 127.0.0.1, so that SNI and Host carry test names
    /// (a.test) while traffic stays on loopback.
    /// </summary>
    public static HttpClient CreateClient(int port, string scheme, string host, Version? version, Action<X509Certificate2>? certificateSeen, X509Certificate2? clientCertificate = null)
    {
        var handler = new SocketsHttpHandler
        {
            AllowAutoRedirect = false,
            UseCookies = false,
            ConnectCallback = async (context, cancellationToken) =>
            {
                var socket = new Socket(SocketType.Stream, ProtocolType.Tcp) { NoDelay = true };
                await socket.ConnectAsync(IPAddress.Loopback, context.DnsEndPoint.Port, cancellationToken);
                return new NetworkStream(socket, ownsSocket: true);
            },
        };
        handler.SslOptions.RemoteCertificateValidationCallback = (_, certificate, _, _) =>
        {
            if (certificate is X509Certificate2 received)
            {
                certificateSeen?.Invoke(received);
            }

            return true;
        };
        if (clientCertificate is not null)
        {
            // Offered whatever CAs the server names, so that an untrusted one reaches the server.
            handler.SslOptions.LocalCertificateSelectionCallback = (_, _, _, _, _) => clientCertificate;
        }

        return new HttpClient(handler)
        {
            BaseAddress = new Uri($"{scheme}://{host}:{port}/"),
            DefaultRequestVersion = version ?? HttpVersion.Version11,
            DefaultVersionPolicy = HttpVersionPolicy.RequestVersionExact,
            Timeout = TimeSpan.FromSeconds(60),
        };
    }

    public async ValueTask DisposeAsync()
    {
        await _app.StopAsync();
        await _app.DisposeAsync();
        try
        {
            Directory.Delete(Folder, recursive: true);
        }
        catch (IOException)
        {
        }
    }
}
