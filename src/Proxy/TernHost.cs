using System.Net;
using Microsoft.AspNetCore.Builder;
using Microsoft.AspNetCore.Connections;
using Microsoft.AspNetCore.DataProtection;
using Microsoft.AspNetCore.Hosting;
using Microsoft.AspNetCore.Http.Timeouts;
using Microsoft.AspNetCore.Server.Kestrel.Core;
using Microsoft.AspNetCore.Server.Kestrel.Transport.Sockets;
using Microsoft.Extensions.Configuration;
using Microsoft.Extensions.DependencyInjection;
using Microsoft.Extensions.DependencyInjection.Extensions;
using Microsoft.Extensions.Hosting;
using Microsoft.Extensions.Logging;
using Microsoft.Extensions.Logging.Console;
using Microsoft.Extensions.Options;
using Tern.Proxy.Configuration;
using Tern.Proxy.Demo;
using Tern.Proxy.Forwarding;
using Tern.Proxy.Listeners;
using Tern.Proxy.Management;
using Tern.Proxy.Telemetry;
using Tern.Proxy.Tls;
using Tern.Proxy.Tls.OpenSsl;
using Yarp.ReverseProxy.Forwarder;

namespace Tern.Proxy;

/// <summary>Where the proxy reads its configuration from.</summary>
public sealed record TernHostOptions
{
    /// <summary>Command-line arguments (the last configuration source, --Tern:Https:Port=9443).</summary>
    public IReadOnlyList<string> Args { get; init; } = [];

    /// <summary>An extra settings file layered over the shipped ones (the TERN_CONFIG variable).</summary>
    public string? ConfigFile { get; init; }

    /// <summary>The folder holding config/appsettings.json: by default the one next to the binary.</summary>
    public string ContentRoot { get; init; } = AppContext.BaseDirectory;

    /// <summary>Selects config/appsettings.{Environment}.json: by default DOTNET_ENVIRONMENT (or ASPNETCORE_ENVIRONMENT), else Production.</summary>
    public string? EnvironmentName { get; init; } = Environment.GetEnvironmentVariable("DOTNET_ENVIRONMENT") ?? Environment.GetEnvironmentVariable("ASPNETCORE_ENVIRONMENT");

    /// <summary>Extra logging set-up for hosts that embed Tern (tests capture its log this way).</summary>
    public Action<ILoggingBuilder>? Logging { get; init; }
}

/// <summary>Builds and runs the proxy: Kestrel listeners, TLS, YARP, management and demo endpoints.</summary>
public static class TernHost
{
    /// <summary>Exit code for configuration that cannot be used.</summary>
    public const int ConfigurationError = 1;

    /// <summary>Runs until SIGTERM/SIGINT; returns the process exit code.</summary>
    public static async Task<int> RunAsync(string[] args)
    {
        SocketEventThreads.DefaultOn();

        // Before anything loads: at a lower limit start-up died on whichever file or assembly it
        // could not open first, with a stack trace that named that file as missing.
        if (OpenFiles.Limit() is { } files && files < OpenFiles.Minimum)
        {
            await Console.Error.WriteLineAsync($"error: Tern may open only {files} files (RLIMIT_NOFILE) and needs at least {OpenFiles.Minimum}: about 250 for itself, 64 it keeps in reserve, and one for each client and upstream connection. Raise the limit (ulimit -n, systemd's LimitNOFILE, the container runtime's nofile).");
            await Console.Error.WriteLineAsync("Tern did not start: its open-file limit is too low.");
            return ConfigurationError;
        }

        var options = new TernHostOptions { Args = args, ConfigFile = Environment.GetEnvironmentVariable("TERN_CONFIG") };
        var app = TryBuild(options, Console.Error);
        if (app is null)
        {
            return ConfigurationError;
        }

        await using (app)
        {
            try
            {
                await app.StartAsync();
            }
            catch (IOException ex)
            {
                // A port taken between the check and the bind, or held with SO_REUSEPORT.
                var bound = app.Services.GetRequiredService<ActiveConfiguration>().Bound;
                var (key, port) = bound.ListenerPorts().FirstOrDefault(p => ex.Message.Contains($":{p.Port}:", StringComparison.Ordinal) || ex.Message.Contains($":{p.Port} ", StringComparison.Ordinal));
                await Console.Error.WriteLineAsync($"error: {key ?? "Tern listeners"}: {ex.Message}{(key is null ? "" : ListenerPorts.EphemeralHint(port))}");
                await Console.Error.WriteLineAsync("Tern did not start: a listener could not be bound.");
                return ConfigurationError;
            }
            catch (InvalidOperationException ex)
            {
                // Kestrel's own checks of its options (ListenerLimits makes those it knows before,
                // naming the key): one line, not a stack trace.
                await Console.Error.WriteLineAsync($"error: {ex.Message.Split('\n')[0]}");
                await Console.Error.WriteLineAsync("Tern did not start: the server refused its options.");
                return ConfigurationError;
            }

            await app.WaitForShutdownAsync();
        }

        return 0;
    }

    /// <summary>
    /// Builds the proxy, or writes one line per configuration problem to errors and returns null.
    /// </summary>
    public static WebApplication? TryBuild(TernHostOptions options, TextWriter errors)
    {
        ArgumentNullException.ThrowIfNull(options);
        ArgumentNullException.ThrowIfNull(errors);
        // The empty builder: no default appsettings sources (with file watchers) to replace, only
        // what Tern uses is added below.
        WebApplicationBuilder builder;
        try
        {
            builder = WebApplication.CreateEmptyBuilder(new WebApplicationOptions
            {
                Args = [.. options.Args],
                ContentRootPath = options.ContentRoot,
                EnvironmentName = options.EnvironmentName,
            });
            AddConfigurationSources(builder.Configuration, builder.Environment.EnvironmentName, options);
        }
        catch (FormatException ex)
        {
            // .NET's command-line parser: "-Key=value" (one dash) or a key given twice.
            errors.WriteLine($"error: command line: {ex.Message} Write settings as --Tern:Https:Port=9443.");
            errors.WriteLine("Tern did not start: 1 configuration problem(s). Settings are documented in README.md.");
            return null;
        }

        // Logging reads the last accepted Logging section, published by the reloader, not the
        // live one: a rejected edit must not change (or silence) the log that reports it.
        var logging = new ConfigurationGate();
        builder.Logging.AddConfiguration(logging.Root.GetSection(ConfigurationSnapshot.LoggingSection));
        builder.Services.AddKeyedSingleton(ConfigurationSnapshot.LoggingSection, logging);
        builder.Logging.AddConsole();
        // A line written inside a request that has an Activity (traces exported, or ASP.NET Core's
        // hosting diagnostics on) names its trace and span among its scopes, so that a line and
        // its trace can be found from each other. Read only when a line is written.
        builder.Services.Configure<LoggerFactoryOptions>(o => o.ActivityTrackingOptions = ActivityTrackingOptions.TraceId | ActivityTrackingOptions.SpanId);
        // The shipped timestamp format ends in the space the simple formatter needs before the
        // level; in a JSON field it would be part of the value, which RFC 3339 parsers refuse.
        builder.Services.PostConfigure<JsonConsoleFormatterOptions>(o => o.TimestampFormat = o.TimestampFormat?.TrimEnd());
        options.Logging?.Invoke(builder.Logging);
        // Lines a client can cause at will, each event a few times per window (LogFloods says
        // which and why); every other line goes through as it is.
        builder.Services.Replace(ServiceDescriptor.Singleton<ILoggerFactory>(services => new LogFloods(new LoggerFactory(
            services.GetServices<ILoggerProvider>(), services.GetRequiredService<IOptionsMonitor<LoggerFilterOptions>>(),
            services.GetService<IOptions<LoggerFactoryOptions>>(), services.GetService<IExternalScopeProvider>()))));
        builder.Services.AddRouting();
        builder.Services.AddMetrics();
        builder.WebHost.UseKestrelCore();

        // Every connection's socket reads and writes go through 32 KB blocks instead of Kestrel's
        // 4 KB ones (BlockPool says why).
        builder.Services.Replace(ServiceDescriptor.Singleton<IMemoryPoolFactory<byte>>(BlockPool.Instance));

        // Tern's accept loop in place of Kestrel's, which spins when the process runs out of
        // files (SocketTransport says why); the connections it makes stay Kestrel's.
        if (SocketTransport.Available)
        {
            builder.Services.Replace(ServiceDescriptor.Singleton<IConnectionListenerFactory, SocketTransport>());
        }

        // Kestrel's half of the event-thread model: its HTTP code runs on the thread where the
        // socket read completed, not after one more hop through the thread pool.
        builder.Services.Configure<SocketTransportOptions>(o => o.UnsafePreferInlineScheduling = SocketEventThreads.Enabled);

        // Armed before the load reads the certificate files: one renewed meanwhile is reloaded.
        // The reloader takes it over once Tern runs.
        var certificateWatch = new CertificateFileWatch(CertificateFileWatch.FilesToRead(builder.Configuration));
        builder.Services.AddSingleton(certificateWatch);
        var snapshot = ConfigurationSnapshot.TryLoad(builder.Configuration, out var found, out var unread);
        var problems = found.ToList();
        if (snapshot is not null)
        {
            problems.AddRange(ListenerPorts.FindBusy(snapshot.Settings));
        }

        var openSsl = new OpenSslEngine();
        if (snapshot is not null && problems.Count == 0 && snapshot.Settings.TlsEngine == TlsEngines.OpenSsl)
        {
            var unavailable = OpenSslEngine.Probe();
            var problem = unavailable is null ? PrepareOpenSsl(openSsl, snapshot) : new ConfigurationProblem("Tern:Tls:Engine", $"{TlsEngines.OpenSsl}: {unavailable}");
            if (problem is not null)
            {
                problems.Add(problem);
            }
        }

        if (snapshot is null || problems.Count > 0)
        {
            foreach (var problem in problems)
            {
                errors.WriteLine($"error: {problem}");
            }

            // What Tern would have warned of once started: a misspelt key is often why a value is missing.
            foreach (var ignored in unread)
            {
                errors.WriteLine($"warn: {ignored.Key} {ignored.Reason}");
            }

            errors.WriteLine($"Tern did not start: {problems.Count} configuration problem(s). Settings are documented in README.md.");
            ((IDisposable)builder.Configuration).Dispose(); // and with it the polls of its files, after the lines are out
            certificateWatch.Dispose();
            return null;
        }

        logging.Publish(snapshot.Logging);
        var app = Build(builder, snapshot, openSsl, errors);
        if (app is null)
        {
            certificateWatch.Dispose();
        }

        return app;
    }

    /// <summary>Builds the OpenSSL contexts for snapshot; returns the problem if OpenSSL rejects a certificate.</summary>
    internal static ConfigurationProblem? PrepareOpenSsl(OpenSslEngine engine, ConfigurationSnapshot snapshot)
    {
        try
        {
            engine.ServerFor(snapshot);
            return null;
        }
        catch (OpenSslException ex)
        {
            return new ConfigurationProblem(ex.Setting ?? "Tern:Tls:Certificates", ex.Message);
        }
    }

    /// <summary>
    /// YARP registers Data Protection for its Cookie and CustomHeader session affinity. Its key
    /// ring is set up only when something is first protected (<see cref="DataProtectionOnFirstUse"/>),
    /// and the hosted service that made a key at every start is dropped. Call it after every
    /// registration that may call <c>AddDataProtection</c> (YARP's): a later one would add the
    /// hosted service back.
    /// </summary>
    private static void DeferDataProtection(IServiceCollection services)
    {
        foreach (var keyAtStart in services.Where(d => d.ServiceType == typeof(IHostedService)
            && d.ImplementationType is { Name: "DataProtectionHostedService" } hosted
            && hosted.Assembly.GetName().Name == "Microsoft.AspNetCore.DataProtection").ToList())
        {
            services.Remove(keyAtStart);
        }

        var provider = services.Last(d => d.ServiceType == typeof(IDataProtectionProvider));
        services.Remove(provider);
        services.AddSingleton<IDataProtectionProvider>(s => new DataProtectionOnFirstUse(() =>
            (IDataProtectionProvider)(provider.ImplementationInstance
                ?? provider.ImplementationFactory?.Invoke(s)
                ?? ActivatorUtilities.CreateInstance(s, provider.ImplementationType!))));
    }

    /// <summary>
    /// Sources in the documented order, later ones winning: config/appsettings.json (shipped),
    /// config/appsettings.{Environment}.json, the TERN_CONFIG file, environment variables
    /// (Tern__Https__Port), then the command line.
    /// </summary>
    private static void AddConfigurationSources(ConfigurationManager manager, string environment, TernHostOptions options)
    {
        manager.Sources.Clear();
        IConfigurationBuilder configuration = manager;
        var folder = Path.Combine(options.ContentRoot, "config");
        configuration.Add(new CheckedJsonFile(Path.Combine(folder, "appsettings.json"), "config/appsettings.json", optional: false));
        configuration.Add(new CheckedJsonFile(Path.Combine(folder, $"appsettings.{environment}.json"), $"config/appsettings.{environment}.json", optional: true));
        if (!string.IsNullOrWhiteSpace(options.ConfigFile))
        {
            configuration.Add(new CheckedJsonFile(options.ConfigFile, $"TERN_CONFIG ({options.ConfigFile})", optional: false));
        }

        configuration.Add(new IndexedEnvironmentVariables());
        configuration.Add(new IndexedCommandLine([.. options.Args]));
    }

    private static WebApplication? Build(WebApplicationBuilder builder, ConfigurationSnapshot snapshot, OpenSslEngine openSsl, TextWriter errors)
    {
        var settings = snapshot.Settings;
        var active = new ActiveConfiguration(snapshot);
        var gate = new ConfigurationGate();
        gate.Publish(snapshot.ReverseProxy);

        builder.Services.AddSingleton(active);
        builder.Services.AddSingleton(gate);
        builder.Services.AddSingleton(openSsl);
        builder.Services.AddSingleton<ProxyConfigOutcome>();
        builder.Services.AddSingleton<Yarp.ReverseProxy.Configuration.IConfigChangeListener>(s => s.GetRequiredService<ProxyConfigOutcome>());
        builder.Services.AddSingleton<TlsMetrics>();
        builder.Services.AddSingleton<Telemetry.OtlpExporterSettings>();
        builder.Services.AddSingleton<Telemetry.MetricsEndpoint>();
        builder.Services.AddSingleton<Telemetry.TraceExport>();
        builder.Services.AddHostedService<ConfigurationReloader>();
        builder.Services.Configure<HostOptions>(o => o.ShutdownTimeout = settings.DrainTimeout);
        // A route's Timeout (YARP's, the whole request's) is carried out by ASP.NET Core's request
        // timeouts; without them every request of such a route was a 500.
        builder.Services.AddRequestTimeouts();
        builder.Services.AddReverseProxy()
            .LoadFromConfig(gate.Root.GetSection(ReverseProxyValidator.Section))
            .AddTransforms<EdgeForwardedHeaders>()
            .AddConfigFilter<AffinityCookieDefaults>();
        OwnLimitsUncounted.WrapRegistered(builder.Services);
        DeferDataProtection(builder.Services);
        builder.Services.AddSingleton<IForwarderHttpClientFactory, UpstreamHttpClientFactory>();

        builder.WebHost.ConfigureKestrel(kestrel =>
        {
            kestrel.AddServerHeader = false;
            kestrel.RequestHeaderEncodingSelector = HeaderBytes.Kestrel;
            kestrel.ResponseHeaderEncodingSelector = HeaderBytes.Kestrel;
            ListenerLimits.Apply(settings.ListenerLimits, kestrel.Limits);
            // HTTP/1.1 and HTTP/2 (by ALPN) are Kestrel's default. Setting them explicitly made
            // Kestrel warn at every start that HTTP/2 was off, which is false: it only recognises
            // TLS it set up itself (UseHttps), and chooses the protocol per connection from ALPN.
            kestrel.ListenAnyIP(settings.HttpsPort, listen => listen.UseTernTls());
            kestrel.ListenAnyIP(settings.HttpPort, listen =>
            {
                listen.Protocols = HttpProtocols.Http1;
                listen.UseLingeringClose();
            });
            kestrel.ListenAnyIP(settings.ManagementPort, listen => listen.Protocols = HttpProtocols.Http1);
            if (settings.DemoEnabled)
            {
                kestrel.Listen(IPAddress.Loopback, settings.DemoPort, listen => listen.Protocols = HttpProtocols.Http1);
            }
        });

        WebApplication? app = null;
        try
        {
            app = builder.Build();
            ConfigurePipeline(app, settings);
        }
        catch (InvalidOperationException ex)
        {
            // YARP's own validation of the ReverseProxy section (match patterns, policies, ...).
            for (Exception? e = ex; e is not null; e = e.InnerException)
            {
                if (e is AggregateException aggregate)
                {
                    foreach (var inner in aggregate.InnerExceptions)
                    {
                        errors.WriteLine($"error: ReverseProxy: {inner.Message}");
                    }

                    break;
                }

                if (e.InnerException is null)
                {
                    errors.WriteLine($"error: ReverseProxy: {e.Message}");
                }
            }

            foreach (var ignored in snapshot.Unread)
            {
                errors.WriteLine($"warn: {ignored.Key} {ignored.Reason}");
            }

            errors.WriteLine("Tern did not start: the ReverseProxy section is invalid.");
            ((IDisposable?)app)?.Dispose();
            ((IDisposable)builder.Configuration).Dispose();
            return null;
        }

        // What the configuration system throws when it applies a change to a settings file (an
        // unreadable file, a logging option .NET cannot parse) is logged, not lost.
        var reloadLogger = app.Services.GetRequiredService<ILogger<ConfigurationReloader>>();
        foreach (var file in ((IConfigurationBuilder)builder.Configuration).Sources.OfType<CheckedJsonFile>())
        {
            file.Failed = ex => TernLog.ReloadNotApplied(reloadLogger, file.Label, ex.Message);
        }

        // Listen from the start (the metrics since ConfigurePipeline), so that /metrics counts
        // everything since then; the certificates' expiry is reported with either engine.
        app.Services.GetRequiredService<TlsMetrics>();
        LogStart(app, snapshot);
        return app;
    }

    private static void ConfigurePipeline(WebApplication app, TernSettings settings)
    {
        // The metrics first: the container disposes in reverse, so the traces' last flush at
        // shutdown is still reported (OtlpExportLog, which the metrics own).
        app.Services.GetRequiredService<Telemetry.MetricsEndpoint>();
        if (app.Services.GetRequiredService<Telemetry.TraceExport>().Exporting)
        {
            int? demoPort = settings.DemoEnabled ? settings.DemoPort : null;
            app.Use((context, next) => Telemetry.TraceExport.CompleteServerSpanAsync(context, next, settings.ManagementPort, demoPort));
        }

        // Management and demo listeners are told apart by the local port the connection arrived
        // on, never by the Host header, which a client controls.
        app.MapWhen(c => c.Connection.LocalPort == settings.ManagementPort, m => m.Run(ManagementEndpoints.HandleAsync));
        if (settings.DemoEnabled)
        {
            app.MapWhen(c => c.Connection.LocalPort == settings.DemoPort && IPAddress.IsLoopback(c.Connection.LocalIpAddress!), d => d.Run(DemoUpstream.HandleAsync));
        }

        app.Use(LingeringClose.NoteAsync);
        app.Use(EdgeRequests.InvokeAsync);
        app.UseRouting();
        // ASP.NET Core's request timeouts only for a route with a Timeout (YARP's metadata): the
        // middleware allocated a closure for every request it saw, timeout or not (about 55 bytes,
        // 1.4% of a proxied request's; loadtest/README.md).
        app.UseWhen(static c => c.GetEndpoint()?.Metadata.GetMetadata<RequestTimeoutAttribute>() is not null, static b => b.UseRequestTimeouts());
        app.Use(PlainHttpPolicy.InvokeAsync);
        app.MapReverseProxy(proxy =>
        {
            proxy.Use(ProxyErrorResponses.InvokeAsync);
            proxy.Use(RequestBodyReads.InvokeAsync);
            proxy.UseSessionAffinity();
            proxy.UseLoadBalancing();
            proxy.UsePassiveHealthChecks();
        });

        // Explicit, so that the 404 below runs only when no route matched (WebApplication would
        // otherwise append the endpoint step after it, where it is never reached).
        app.UseEndpoints(_ => { });
        app.Run(context =>
        {
            context.Response.StatusCode = StatusCodes.Status404NotFound;
            context.Response.ContentType = "text/plain; charset=utf-8";
            return context.Response.WriteAsync("404 Not Found: no route matches this host and path\n");
        });
    }

    private static void LogStart(WebApplication app, ConfigurationSnapshot snapshot)
    {
        var logger = app.Services.GetRequiredService<ILoggerFactory>().CreateLogger("Tern.Proxy");
        var settings = snapshot.Settings;
        foreach (var unread in snapshot.Unread)
        {
            TernLog.Unread(logger, unread);
        }

        if (snapshot.SelfSigned)
        {
            TernLog.SelfSignedInUse(logger, settings.SelfSignedDirectory);
        }

        foreach (var certificate in snapshot.Certificates.All)
        {
            var hosts = certificate.Hosts;
            TernLog.CertificateInUse(logger, settings.TlsEngine, certificate.Name, certificate.Certificate.Subject, certificate.Certificate.NotAfter.ToUniversalTime(), hosts.Count == 0 ? "(default)" : string.Join(", ", hosts));
            if (certificate.Certificate.NotAfter < DateTime.Now)
            {
                TernLog.CertificateExpired(logger, certificate.Name, certificate.Certificate.Subject, certificate.Certificate.NotAfter.ToUniversalTime());
            }
        }

        foreach (var (key, port, first, last) in ListenerPorts.InEphemeralRange(settings))
        {
            TernLog.PortInEphemeralRange(logger, key, port, first, last, ListenerPorts.EphemeralAdvice(first));
        }

        if (settings.DemoEnabled)
        {
            TernLog.DemoEnabled(logger, settings.DemoPort);
        }

        if (SocketEventThreads.Enabled)
        {
            TernLog.EventThreads(logger, SocketEventThreads.Variable);
        }
        else
        {
            TernLog.ThreadPoolIo(logger, SocketEventThreads.Variable, Environment.GetEnvironmentVariable(SocketEventThreads.Variable) ?? "");
        }

        if (!SocketTransport.Available)
        {
            TernLog.KestrelAcceptLoop(logger);
        }

        if (!OpenFiles.OpenProbe())
        {
            TernLog.NoDescriptorProbe(logger);
        }

        var (spinLimit, spinSource) = ThreadPoolSpin.Effective();
        TernLog.ThreadPoolSpinLimit(logger, spinLimit, spinSource);

        var lifetime = app.Services.GetRequiredService<IHostApplicationLifetime>();
        lifetime.ApplicationStarted.Register(() => TernLog.Listening(logger, settings.HttpsPort, settings.HttpPort, settings.RedirectHttpsPort ?? settings.HttpsPort, settings.ManagementPort));
        lifetime.ApplicationStopping.Register(() => TernLog.Draining(logger, settings.DrainTimeout));
    }
}
