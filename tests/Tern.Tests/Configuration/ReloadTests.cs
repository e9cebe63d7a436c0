using System.Net;
using System.Security.Cryptography;
using System.Security.Cryptography.X509Certificates;
using Tern.Tests.Infrastructure;

namespace Tern.Tests.Configuration;

public abstract class ReloadTests(string engine) : IAsyncLifetime
{
    private TestUpstream _first = null!;
    private TestUpstream _second = null!;

    public async Task InitializeAsync()
    {
        _first = await TestUpstream.StartAsync("first");
        _second = await TestUpstream.StartAsync("second");
    }

    public async Task DisposeAsync()
    {
        await _first.DisposeAsync();
        await _second.DisposeAsync();
    }

    [Fact]
    public async Task Reload_AddsRoute_WhileLongDownloadOnOpenConnectionCompletes()
    {
        var config = new TernConfig(engine).Route("a", "first", "/a/{**rest}", PrefixRemoved("/a")).Cluster("first", [_first]);
        await using var tern = await TernInstance.StartAsync(config);
        using var downloader = tern.CreateClient();
        using var client = tern.CreateClient();

        // The upstream sends half of 40 chunks of 64 KB, then holds the response open.
        using var download = await downloader.GetAsync(new Uri("/a/hold/40", UriKind.Relative), HttpCompletionOption.ResponseHeadersRead);
        var body = await download.Content.ReadAsStreamAsync();
        var received = new MemoryStream();
        var buffer = new byte[64 * 1024];
        received.Write(buffer, 0, await body.ReadAsync(buffer));

        config.Route("b", "second", "/b/{**rest}", PrefixRemoved("/b")).Cluster("second", [_second]);
        await tern.RewriteConfigAsync(config.ToJson());
        Assert.Equal("second", await EventuallyAsync(client, "/b/name", "second"));

        // Only now may the download finish, on the connection opened before the reload.
        _first.Release.SetResult();
        await body.CopyToAsync(received);
        Assert.Equal(40 * 64 * 1024, received.Length);
        var expected = new MemoryStream();
        for (var i = 0; i < 40; i++)
        {
            expected.Write(TestUpstream.Pattern(64 * 1024));
        }

        Assert.Equal(SHA256.HashData(expected.ToArray()), SHA256.HashData(received.ToArray()));
    }

    /// <summary>
    /// A route's Timeout set, then taken away, by reloads applies to the next request: ASP.NET
    /// Core's request timeouts run only for routes that have one (their metadata, which YARP
    /// rebuilds at each reload), so a Timeout added later is carried out, not refused as a 500.
    /// </summary>
    [Fact]
    public async Task Reload_RouteTimeoutAddedThenRemoved_AppliesToTheNextRequest()
    {
        var config = new TernConfig(engine).Route("a", "first", "/a/{**rest}", PrefixRemoved("/a")).Cluster("first", [_first]);
        await using var tern = await TernInstance.StartAsync(config);
        using var client = tern.CreateClient();
        Assert.Equal("slow done", await client.GetStringAsync(new Uri("/a/slow/1500", UriKind.Relative)));

        var timed = PrefixRemoved("/a");
        timed["Timeout"] = "00:00:00.500";
        config.Route("a", "first", "/a/{**rest}", timed);
        await tern.RewriteConfigAsync(config.ToJson());
        Assert.Equal("504 Gateway Timeout: the upstream of cluster 'first' did not complete the response within the route's Timeout\n", await EventuallyAsync(client, "/a/slow/1500", "504 Gateway Timeout: the upstream of cluster 'first' did not complete the response within the route's Timeout\n"));

        config.Route("a", "first", "/a/{**rest}", PrefixRemoved("/a"));
        await tern.RewriteConfigAsync(config.ToJson());
        Assert.Equal("slow done", await EventuallyAsync(client, "/a/slow/1500", "slow done"));
        Assert.DoesNotContain(tern.Logs.Lines, l => l.Contains("returned 500", StringComparison.Ordinal));
    }

    [Fact]
    public async Task Reload_InvalidChange_KeepsLastGoodConfiguration()
    {
        var config = new TernConfig(engine).Route("a", "first", "/a/{**rest}", PrefixRemoved("/a")).Cluster("first", [_first]);
        await using var tern = await TernInstance.StartAsync(config);
        using var client = tern.CreateClient();

        // A route to a cluster that does not exist, then a half-written file: both refused.
        var broken = new TernConfig(engine).Route("a", "first", "/a/{**rest}", PrefixRemoved("/a")).Route("b", "missing", "/b/{**rest}").Cluster("first", [_first]);
        await tern.RewriteConfigAsync(broken.ToJson());
        await tern.Logs.WaitForAsync("Configuration reload: ReverseProxy:Routes:b:ClusterId: cluster 'missing' is not defined");
        await tern.Logs.WaitForAsync("Configuration reload rejected (1 problem(s))");
        Assert.Equal("first", await client.GetStringAsync(new Uri("/a/name", UriKind.Relative)));
        Assert.Equal(HttpStatusCode.NotFound, (await client.GetAsync(new Uri("/b/name", UriKind.Relative))).StatusCode);

        // The first rewrite, caught half-written, may have logged this line already: only a new one counts.
        var logged = tern.Logs.Count;
        await tern.RewriteConfigAsync("{ \"ReverseProxy\": { \"Routes\": ");
        await tern.Logs.WaitForAsync("Configuration reload: config/appsettings.json: not valid JSON", after: logged);
        Assert.Equal("first", await client.GetStringAsync(new Uri("/a/name", UriKind.Relative)));

        // A valid change after the broken ones is applied.
        config.Route("b", "second", "/b/{**rest}", PrefixRemoved("/b")).Cluster("second", [_second]);
        await tern.RewriteConfigAsync(config.ToJson());
        Assert.Equal("second", await EventuallyAsync(client, "/b/name", "second"));
    }

    /// <summary>
    /// A null in a later file over what an earlier one gives is refused (it takes nothing away);
    /// once that later file is gone, so is its null: the reload after it applies. (Configuration
    /// empties a file gone missing without reading it, and its nulls were still named.)
    /// </summary>
    [Fact]
    public async Task Reload_NullOverAnEarlierFile_IsRejected_UntilTheFileWithItGoes()
    {
        var config = new TernConfig(engine).Route("a", "first", "/a/{**rest}", PrefixRemoved("/a")).Cluster("first", [_first]);
        var later = "";
        await using var tern = await TernInstance.StartAsync(config, o =>
        {
            later = Path.Combine(o.ContentRoot, "config", $"appsettings.{o.EnvironmentName}.json");
            File.WriteAllText(later, """{ "Tern": { "Forwarding": { "TrustedProxies": null } } }""");
            return o;
        });
        using var client = tern.CreateClient();

        config.Tern["Forwarding"] = new System.Text.Json.Nodes.JsonObject { ["TrustedProxies"] = new System.Text.Json.Nodes.JsonArray("10.0.0.0/8") };
        config.Route("b", "second", "/b/{**rest}", PrefixRemoved("/b")).Cluster("second", [_second]);
        await tern.RewriteConfigAsync(config.ToJson());
        await tern.Logs.WaitForAsync($"Configuration reload: Tern:Forwarding:TrustedProxies: a null or empty value in config/{Path.GetFileName(later)} takes nothing away");
        Assert.Equal(HttpStatusCode.NotFound, (await client.GetAsync(new Uri("/b/name", UriKind.Relative))).StatusCode);

        File.Delete(later);
        Assert.Equal("second", await EventuallyAsync(client, "/b/name", "second"));
    }

    /// <summary>
    /// A route whose Match:Path has a constraint ASP.NET Core's router cannot resolve: YARP took
    /// it, and the router then failed to build its table at every request, so the reload made every
    /// request of every route a 500. Refused now, naming the key, and the routes before it serve on.
    /// </summary>
    [Fact]
    public async Task Reload_RouteConstraintTheRouterCannotResolve_IsRejected_AndEveryRouteServesOn()
    {
        var config = new TernConfig(engine).Route("a", "first", "/a/{**rest}", PrefixRemoved("/a")).Cluster("first", [_first]);
        await using var tern = await TernInstance.StartAsync(config);
        using var client = tern.CreateClient();

        var broken = new TernConfig(engine).Route("a", "first", "/a/{**rest}", PrefixRemoved("/a")).Route("b", "first", "/b/{id:number}").Cluster("first", [_first]);
        await tern.RewriteConfigAsync(broken.ToJson());
        await tern.Logs.WaitForAsync("Configuration reload: ReverseProxy:Routes:b:Match:Path: '/b/{id:number}': 'number' in {id:number} is not one of ASP.NET Core's route constraints (alpha, bool,");
        await tern.Logs.WaitForAsync("Configuration reload rejected (1 problem(s))");
        Assert.Equal("first", await client.GetStringAsync(new Uri("/a/name", UriKind.Relative)));
        Assert.Equal(HttpStatusCode.NotFound, (await client.GetAsync(new Uri("/b/1", UriKind.Relative))).StatusCode);
    }

    [Fact]
    public async Task Reload_CertificateChange_AppliesToNewHandshakesOnly()
    {
        var config = new TernConfig(engine).Route("a", "first", "{**rest}").Cluster("first", [_first]);
        await using var tern = await TernInstance.StartAsync(config);
        X509Certificate2? kept = null;
        using var open = tern.CreateClient(certificateSeen: c => kept = c);
        await open.GetStringAsync(new Uri("/name", UriKind.Relative));
        Assert.Equal(TestPki.Localhost.Thumbprint, kept!.Thumbprint);

        config.Certificates(("default", TestPki.BTest, []));
        await tern.RewriteConfigAsync(config.ToJson());

        string? fresh = null;
        for (var i = 0; i < 100 && fresh != TestPki.BTest.Thumbprint; i++)
        {
            await Task.Delay(100);
            using var client = tern.CreateClient(certificateSeen: c => fresh = c.Thumbprint);
            await client.GetStringAsync(new Uri("/name", UriKind.Relative));
        }

        Assert.Equal(TestPki.BTest.Thumbprint, fresh);

        // The connection opened before the reload still serves, without a new handshake.
        kept = null;
        Assert.Equal("first", await open.GetStringAsync(new Uri("/name", UriKind.Relative)));
        Assert.Null(kept);
    }

    [Fact]
    public async Task Reload_CertificateFilesRenewedInPlace_NewHandshakesGetRenewedCertificate()
    {
        var folder = Directory.CreateTempSubdirectory("tern-renew-").FullName;
        var original = TestPki.Create("site", ["localhost"], folder);
        var config = new TernConfig(engine).Route("a", "first", "{**rest}").Cluster("first", [_first]).Certificates(("site", original, []));
        await using var tern = await TernInstance.StartAsync(config);

        // Same paths, new content: what cert-manager or a Secret rotation does.
        var renewed = TestPki.Create("site", ["localhost"], folder);

        string? seen = null;
        for (var i = 0; i < 100 && seen != renewed.Thumbprint; i++)
        {
            await Task.Delay(100);
            using var client = tern.CreateClient(certificateSeen: c => seen = c.Thumbprint);
            await client.GetStringAsync(new Uri("/name", UriKind.Relative));
        }

        Assert.NotEqual(original.Thumbprint, renewed.Thumbprint);
        Assert.Equal(renewed.Thumbprint, seen);
    }

    [Fact]
    public async Task Start_CertificateRenewedWhileTernStarts_IsPickedUp()
    {
        // Renewed after the first load read the files and before the watch of a running Tern:
        // missed, the old certificate would be served until the next renewal, after it expired.
        var folder = Directory.CreateTempSubdirectory("tern-starting-").FullName;
        var config = new TernConfig(engine).Route("a", "first", "{**rest}").Cluster("first", [_first]).Certificates(("site", TestPki.Create("site", ["localhost"], folder), []));
        PemPair? renewed = null;
        await using var tern = await TernInstance.StartAsync(config, built: () =>
        {
            renewed = TestPki.Create("site", ["localhost"], folder);
            return Task.CompletedTask;
        });

        Assert.Equal(renewed!.Thumbprint, await EventuallyServedAsync(tern, renewed.Thumbprint));
    }

    /// <summary>
    /// A new cluster that YARP's validation rejects (a policy it does not know), or whose values
    /// its reader cannot convert: YARP alone would name no key for the second and log its exception
    /// with a stack trace. Each problem is one line, the reload is rejected, the last good routes stay.
    /// </summary>
    [Theory]
    [InlineData("""{ "LoadBalancingPolicy": "Nope" }""", "Configuration reload: ReverseProxy: No matching ILoadBalancingPolicy found for the load balancing policy 'Nope'")]
    [InlineData("""{ "HttpRequest": { "VersionPolicy": "Whatever", "ActivityTimeout": "30" } }""",
        "Configuration reload: ReverseProxy:Clusters:second:HttpRequest:VersionPolicy: 'Whatever' is not a valid value: Requested value 'Whatever' was not found.|"
        + "Configuration reload: ReverseProxy:Clusters:second:HttpRequest:ActivityTimeout: '30' is not a duration")]
    [InlineData("""{ "HttpRequest": { "ActivityTimeout": "NaN" } }""", "Configuration reload: ReverseProxy:Clusters:second:HttpRequest:ActivityTimeout: 'NaN' is not a duration")]
    [InlineData("""{ "HealthCheck": { "Active": { "Enabled": true, "Path": "health" } } }""", "Configuration reload: ReverseProxy:Clusters:second:HealthCheck:Active:Path: 'health' does not start with /")]
    [InlineData("""{ "SessionAffinity": { "Enabled": true, "Policy": "ArrCookie", "AffinityKeyName": "aff;x" } }""", "Configuration reload: ReverseProxy:Clusters:second:SessionAffinity:AffinityKeyName: 'aff;x' is not a cookie name")]
    public async Task Reload_ClusterTernOrYarpRejects_IsLoggedNamingTheProblem_AndTheLastGoodStay(string cluster, string expected)
    {
        var config = new TernConfig(engine).Route("a", "first", "/a/{**rest}", PrefixRemoved("/a")).Cluster("first", [_first]);
        await using var tern = await TernInstance.StartAsync(config);
        using var client = tern.CreateClient();

        var rejected = new TernConfig(engine).Route("a", "first", "/a/{**rest}", PrefixRemoved("/a")).Route("b", "second", "/b/{**rest}", PrefixRemoved("/b"))
            .Cluster("first", [_first]).Cluster("second", [_second], (System.Text.Json.Nodes.JsonObject)System.Text.Json.Nodes.JsonNode.Parse(cluster)!);
        await tern.RewriteConfigAsync(rejected.ToJson());

        foreach (var line in expected.Split('|'))
        {
            await tern.Logs.WaitForAsync(line);
        }

        await tern.Logs.WaitForAsync("Configuration reload rejected");
        Assert.DoesNotContain(tern.Logs.Lines, l => l.Contains("Configuration reloaded", StringComparison.Ordinal) || l.Contains("Exception", StringComparison.Ordinal));
        Assert.Equal("first", await client.GetStringAsync(new Uri("/a/name", UriKind.Relative)));
        Assert.Equal(HttpStatusCode.NotFound, (await client.GetAsync(new Uri("/b/name", UriKind.Relative))).StatusCode);
    }

    /// <summary>
    /// A key YARP does not read (misspelt, or a later YARP's) is dropped by YARP without a word:
    /// Tern names it, with the key meant, at start and on each reload, and applies the rest.
    /// </summary>
    [Fact]
    public async Task KeyYarpDoesNotRead_IsNamedAtStartAndOnReload_AndTheRestApplies()
    {
        var misspelt = (System.Text.Json.Nodes.JsonObject)System.Text.Json.Nodes.JsonNode.Parse("""{ "HttpClient": { "MaxConnectionsPerServr": 5 } }""")!;
        var config = new TernConfig(engine).Route("a", "first", "/a/{**rest}", PrefixRemoved("/a")).Cluster("first", [_first], misspelt);
        await using var tern = await TernInstance.StartAsync(config);
        await tern.Logs.WaitForAsync("ReverseProxy:Clusters:first:HttpClient:MaxConnectionsPerServr is not read by YARP 2.1 and is ignored (misspelt? YARP reads MaxConnectionsPerServer)");
        using var client = tern.CreateClient();

        var second = (System.Text.Json.Nodes.JsonObject)System.Text.Json.Nodes.JsonNode.Parse("""{ "HttpRequest": { "ActivityTimout": "00:00:05" } }""")!;
        var changed = new TernConfig(engine).Route("a", "first", "/a/{**rest}", PrefixRemoved("/a")).Route("b", "second", "/b/{**rest}", PrefixRemoved("/b"))
            .Cluster("first", [_first]).Cluster("second", [_second], second);
        await tern.RewriteConfigAsync(changed.ToJson());

        await tern.Logs.WaitForAsync("ReverseProxy:Clusters:second:HttpRequest:ActivityTimout is not read by YARP 2.1 and is ignored (misspelt? YARP reads ActivityTimeout)");
        await tern.Logs.WaitForAsync("Configuration reloaded");
        Assert.Equal("second", await client.GetStringAsync(new Uri("/b/name", UriKind.Relative)));
        Assert.Single(tern.Logs.Lines, l => l.Contains("MaxConnectionsPerServr", StringComparison.Ordinal)); // gone from the file, not named again

        // Its value changed (an operator's attempt to change the timeout): named again, since it
        // still does nothing.
        second["HttpRequest"]!["ActivityTimout"] = "00:00:09";
        await tern.RewriteConfigAsync(changed.ToJson());
        var deadline = DateTime.UtcNow + TimeSpan.FromSeconds(15);
        while (tern.Logs.Lines.Count(l => l.Contains("HttpRequest:ActivityTimout is not read", StringComparison.Ordinal)) < 2)
        {
            Assert.True(DateTime.UtcNow < deadline, string.Join("\n", tern.Logs.Lines));
            await Task.Delay(50);
        }
    }

    [Fact]
    public async Task Reload_CertificateMovedThenRenewedInPlace_IsPickedUp()
    {
        var one = Directory.CreateTempSubdirectory("tern-one-").FullName;
        var two = Directory.CreateTempSubdirectory("tern-two-").FullName;
        var config = new TernConfig(engine).Route("a", "first", "{**rest}").Cluster("first", [_first]).Certificates(("site", TestPki.Create("site", ["localhost"], two), []));
        await using var tern = await TernInstance.StartAsync(config);

        var moved = TestPki.Create("site", ["localhost"], one);
        config.Certificates(("site", moved, []));
        await tern.RewriteConfigAsync(config.ToJson());
        Assert.Equal(moved.Thumbprint, await EventuallyServedAsync(tern, moved.Thumbprint));

        // The watch now follows the new folder: renewing there in place is seen too.
        var renewed = TestPki.Create("site", ["localhost"], one);
        Assert.Equal(renewed.Thumbprint, await EventuallyServedAsync(tern, renewed.Thumbprint));
    }

    [Fact]
    public async Task Reload_CertificatePathsNamedBeforeTheFilesExist_AreAppliedWhenTheyAppear()
    {
        var old = Directory.CreateTempSubdirectory("tern-old-").FullName;
        var future = Directory.CreateTempSubdirectory("tern-future-").FullName;
        var config = new TernConfig(engine).Route("a", "first", "{**rest}").Cluster("first", [_first]).Certificates(("site", TestPki.Create("site", ["localhost"], old), []));
        await using var tern = await TernInstance.StartAsync(config);

        // The settings name files a deployment has not written yet: rejected, the old certificate stays...
        config.Certificates(("site", new PemPair(Path.Combine(future, "site.crt"), Path.Combine(future, "site.key"), "-"), []));
        var after = tern.Logs.Count;
        await tern.RewriteConfigAsync(config.ToJson());
        await tern.Logs.WaitForAsync("Configuration reload rejected", after: after);

        // ...until the files appear, with no further edit of the settings.
        var arrived = TestPki.Create("site", ["localhost"], future);
        Assert.Equal(arrived.Thumbprint, await EventuallyServedAsync(tern, arrived.Thumbprint));
    }

    [Fact]
    public async Task Reload_KubernetesSecretSwapped_NewHandshakesGetRenewedCertificate()
    {
        // A secret as the kubelet mounts it: tls.crt -> ..data/tls.crt and ..data -> a timestamped
        // folder. An update writes a new folder and renames a new ..data link over the old one,
        // so the files Tern names are never written to.
        var mount = Directory.CreateTempSubdirectory("tern-secret-").FullName;
        var first = TestPki.Create("tls", ["localhost"], Directory.CreateDirectory(Path.Combine(mount, "..2026_11_25_01")).FullName);
        Directory.CreateSymbolicLink(Path.Combine(mount, "..data"), "..2026_11_25_01");
        File.CreateSymbolicLink(Path.Combine(mount, "tls.crt"), "..data/tls.crt");
        File.CreateSymbolicLink(Path.Combine(mount, "tls.key"), "..data/tls.key");
        var mounted = new PemPair(Path.Combine(mount, "tls.crt"), Path.Combine(mount, "tls.key"), first.Thumbprint);
        var config = new TernConfig(engine).Route("a", "first", "{**rest}").Cluster("first", [_first]).Certificates(("site", mounted, []));
        await using var tern = await TernInstance.StartAsync(config);
        Assert.Equal(first.Thumbprint, await EventuallyServedAsync(tern, first.Thumbprint));

        var second = TestPki.Create("tls", ["localhost"], Directory.CreateDirectory(Path.Combine(mount, "..2026_11_25_02")).FullName);
        await SwapLinkAsync(mount, "..data", "..2026_11_25_02");
        Directory.Delete(Path.Combine(mount, "..2026_11_25_01"), recursive: true);

        Assert.Equal(second.Thumbprint, await EventuallyServedAsync(tern, second.Thumbprint));
    }

    [Fact]
    public async Task Reload_SettingsFileReplacedByConfigMapLinks_IsAppliedAtEachSwap()
    {
        var config = new TernConfig(engine).Route("a", "first", "/a/{**rest}", PrefixRemoved("/a")).Cluster("first", [_first]);
        await using var tern = await TernInstance.StartAsync(config);
        using var client = tern.CreateClient();
        var folder = Path.Combine(tern.Folder, "config");

        // The plain file is replaced by a rename, with a link into a config map's ..data folder.
        Directory.CreateDirectory(Path.Combine(folder, "..v1"));
        await File.WriteAllTextAsync(Path.Combine(folder, "..v1", "appsettings.json"), config.Route("b", "second", "/b/{**rest}", PrefixRemoved("/b")).Cluster("second", [_second]).ToJson());
        Directory.CreateSymbolicLink(Path.Combine(folder, "..data"), "..v1");
        File.CreateSymbolicLink(Path.Combine(folder, "appsettings.json.new"), "..data/appsettings.json");
        File.Move(Path.Combine(folder, "appsettings.json.new"), Path.Combine(folder, "appsettings.json"), overwrite: true);
        Assert.Equal("second", await EventuallyAsync(client, "/b/name", "second"));

        // Then the config map changes: only the ..data link is swapped.
        Directory.CreateDirectory(Path.Combine(folder, "..v2"));
        await File.WriteAllTextAsync(Path.Combine(folder, "..v2", "appsettings.json"), config.Route("c", "first", "/c/{**rest}", PrefixRemoved("/c")).ToJson());
        await SwapLinkAsync(folder, "..data", "..v2");
        Assert.Equal("first", await EventuallyAsync(client, "/c/name", "first"));
    }

    /// <summary>
    /// Logging values .NET cannot use: its logger filter throws on the change itself, and a console
    /// timestamp format it cannot write with throws at every line written after it; that must
    /// neither end the process nor go unreported.
    /// </summary>
    [Theory]
    [InlineData("""{ "LogLevel": { "Microsoft": { "AspNetCore": "Verbose" } } }""", "Logging:LogLevel:Microsoft:AspNetCore: 'Verbose' is not a log level")] // Logging__LogLevel__Microsoft__AspNetCore=Verbose
    [InlineData("""{ "Console": { "FormatterOptions": { "TimestampFormat": "%" } } }""", "Logging:Console:FormatterOptions:TimestampFormat: '%' is not a .NET date and time format")]
    public async Task Reload_LoggingValueNetCannotUse_IsRejectedNamingTheKeyAndTernServesOn(string logging, string problem)
    {
        var config = new TernConfig(engine).Route("a", "first", "/a/{**rest}", PrefixRemoved("/a")).Cluster("first", [_first]);
        await using var tern = await TernInstance.StartAsync(config);
        using var client = tern.CreateClient();

        await AddRouteBWithLoggingAsync(tern, config, logging);

        await tern.Logs.WaitForAsync($"Configuration reload: {problem}");
        await tern.Logs.WaitForAsync("Configuration reload rejected (1 problem(s))");
        Assert.Equal("first", await client.GetStringAsync(new Uri("/a/name", UriKind.Relative)));
        Assert.Equal(HttpStatusCode.NotFound, (await client.GetAsync(new Uri("/b/name", UriKind.Relative))).StatusCode);
    }

    [Fact]
    public async Task Reload_RejectedEditThatWouldSilenceTheLog_ChangesNoLogLevel()
    {
        // Logging reads the last accepted configuration: a rejected edit that also turns Tern's
        // log off must not hide the lines that reject it.
        var config = new TernConfig(engine).Route("a", "first", "/a/{**rest}", PrefixRemoved("/a")).Cluster("first", [_first]);
        await using var tern = await TernInstance.StartAsync(config);
        using var client = tern.CreateClient();

        var json = System.Text.Json.Nodes.JsonNode.Parse(config.Route("b", "nowhere", "/b/{**rest}").ToJson())!;
        json["Logging"] = System.Text.Json.Nodes.JsonNode.Parse("""{ "LogLevel": { "Tern": "None" } }""");
        await tern.RewriteConfigAsync(json.ToJsonString());

        await tern.Logs.WaitForAsync("Configuration reload rejected (1 problem(s))");
        Assert.Contains(tern.Logs.Lines, l => l.Contains("'nowhere'", StringComparison.Ordinal));
        Assert.Equal("first", await client.GetStringAsync(new Uri("/a/name", UriKind.Relative)));
    }

    [Fact]
    public async Task Reload_EveryCertificateRemoved_WarnsAsAtStartThatTheSelfSignedOneServes()
    {
        var folder = Directory.CreateTempSubdirectory("tern-selfsigned-").FullName;
        try
        {
            var config = new TernConfig(engine).Route("a", "first", "{**rest}").Cluster("first", [_first]);
            config.Tls["SelfSignedDirectory"] = folder;
            await using var tern = await TernInstance.StartAsync(config);

            config.Tls.Remove("Certificates");
            await tern.RewriteConfigAsync(config.ToJson());

            await tern.Logs.WaitForAsync($"No certificate is configured under Tern:Tls:Certificates; serving a self-signed certificate for localhost from {folder}");
            await tern.Logs.WaitForAsync("Configuration reloaded");
            string? subject = null;
            using var client = tern.CreateClient(certificateSeen: c => subject = c.Subject);
            Assert.Equal("first", await client.GetStringAsync(new Uri("/name", UriKind.Relative)));
            Assert.Equal("CN=localhost", subject);
        }
        finally
        {
            Directory.Delete(folder, recursive: true);
        }
    }

    /// <summary>Rewrites the settings with a route /b to the second upstream and this Logging section.</summary>
    private async Task AddRouteBWithLoggingAsync(TernInstance tern, TernConfig config, string logging)
    {
        var json = System.Text.Json.Nodes.JsonNode.Parse(config.Route("b", "second", "/b/{**rest}", PrefixRemoved("/b")).Cluster("second", [_second]).ToJson())!;
        json["Logging"] = System.Text.Json.Nodes.JsonNode.Parse(logging);
        await tern.RewriteConfigAsync(json.ToJsonString());
    }

    [Theory]
    [InlineData("appsettings.json")]
    [InlineData("appsettings.Test.json")] // optional, yet a dangling link is no file left out
    public async Task Reload_SettingsFileBecomesDanglingLink_IsRejectedAndTernServesOn(string file)
    {
        var config = new TernConfig(engine).Route("a", "first", "/a/{**rest}", PrefixRemoved("/a")).Cluster("first", [_first]);
        await using var tern = await TernInstance.StartAsync(config);
        using var client = tern.CreateClient();
        var folder = Path.Combine(tern.Folder, "config");
        if (!File.Exists(Path.Combine(folder, file)))
        {
            await File.WriteAllTextAsync(Path.Combine(folder, file), "{}");
            await tern.Logs.WaitForAsync("Configuration reloaded");
        }

        File.CreateSymbolicLink(Path.Combine(folder, file + ".new"), "..gone/" + file);
        File.Move(Path.Combine(folder, file + ".new"), Path.Combine(folder, file), overwrite: true);

        await tern.Logs.WaitForAsync($"Configuration reload: config/{file}: it is a link to '..gone/{file}', which leads to no file");
        await tern.Logs.WaitForAsync("Configuration reload rejected");
        Assert.Equal("first", await client.GetStringAsync(new Uri("/a/name", UriKind.Relative)));
    }

    /// <summary>
    /// A FIFO where a file was (a mistaken mount, a script's named pipe) blocks whoever opens it
    /// until someone writes. Tern must neither read it nor let it stall the one thread that polls
    /// every file: the change is refused naming the file, and a later fix is still seen.
    /// </summary>
    [Fact]
    public async Task Reload_SettingsFileBecomesAFifo_IsRejectedAndLaterChangesStillApply()
    {
        var config = new TernConfig(engine).Route("a", "first", "/a/{**rest}", PrefixRemoved("/a")).Cluster("first", [_first]);
        await using var tern = await TernInstance.StartAsync(config);
        using var client = tern.CreateClient();
        var settings = Path.Combine(tern.Folder, "config", "appsettings.json");
        var fifo = settings + ".fifo";
        Assert.Equal(0, (await Tool.RunAsync("mkfifo", [fifo])).ExitCode);
        File.Move(fifo, settings, overwrite: true);

        await tern.Logs.WaitForAsync("Configuration reload: config/appsettings.json: it is a FIFO, not a regular file");
        await tern.Logs.WaitForAsync("Configuration reload rejected");
        Assert.Equal("first", await client.GetStringAsync(new Uri("/a/name", UriKind.Relative)));

        File.Delete(settings);
        config.Route("b", "second", "/b/{**rest}", PrefixRemoved("/b")).Cluster("second", [_second]);
        await tern.RewriteConfigAsync(config.ToJson());
        Assert.Equal("second", await EventuallyAsync(client, "/b/name", "second"));
    }

    [Fact]
    public async Task Reload_CertificateFileBecomesADevice_IsRejectedAndTheCertificateStays()
    {
        var folder = Directory.CreateTempSubdirectory("tern-device-").FullName;
        try
        {
            var original = TestPki.Create("site", ["localhost"], folder);
            var config = new TernConfig(engine).Route("a", "first", "{**rest}").Cluster("first", [_first]).Certificates(("site", original, []));
            await using var tern = await TernInstance.StartAsync(config);

            // /dev/zero never ends: read whole, it would take all of Tern's memory.
            File.Delete(original.CertificatePath);
            File.CreateSymbolicLink(original.CertificatePath, "/dev/zero");

            await tern.Logs.WaitForAsync($"Configuration reload: Tern:Tls:Certificates:site:CertificatePath: cannot read '{original.CertificatePath}': it is a character device, not a regular file");
            string? seen = null;
            using var client = tern.CreateClient(certificateSeen: c => seen = c.Thumbprint);
            Assert.Equal("first", await client.GetStringAsync(new Uri("/name", UriKind.Relative)));
            Assert.Equal(original.Thumbprint, seen);
        }
        finally
        {
            Directory.Delete(folder, recursive: true);
        }
    }

    [Fact]
    public async Task Reload_LoggingOptionNetCannotConvert_IsLoggedAndTheRestApplies()
    {
        var config = new TernConfig(engine).Route("a", "first", "/a/{**rest}", PrefixRemoved("/a")).Cluster("first", [_first]);
        await using var tern = await TernInstance.StartAsync(config);
        using var client = tern.CreateClient();

        await AddRouteBWithLoggingAsync(tern, config, """{ "CaptureScopes": "maybe" }""");

        await tern.Logs.WaitForAsync("Configuration reload: Logging: .NET could not apply the change (");
        Assert.Contains(tern.Logs.Lines, l => l.Contains("Logging:CaptureScopes", StringComparison.Ordinal));
        Assert.Equal("second", await EventuallyAsync(client, "/b/name", "second"));
    }

    [Fact]
    public async Task Watching_SettingsAndCertificateFolders_HoldsNoInotifyWatchOnThem()
    {
        // Files are polled: an inotify watch on these folders would wake Tern at every write to any
        // file in them (a log beside the settings, say).
        var certificates = Directory.CreateTempSubdirectory("tern-quiet-").FullName;
        var config = new TernConfig(engine).Route("a", "first", "{**rest}").Cluster("first", [_first]).Certificates(("site", TestPki.Create("site", ["localhost"], certificates), []));
        await using var tern = await TernInstance.StartAsync(config);
        using var client = tern.CreateClient();
        Assert.Equal("first", await client.GetStringAsync(new Uri("/name", UriKind.Relative)));

        var folders = new[] { Path.Combine(tern.Folder, "config"), certificates };
        var inodes = new List<long>();
        foreach (var folder in folders)
        {
            var (exit, output) = await Tool.RunAsync("stat", ["-c", "%i", folder]);
            Assert.Equal(0, exit);
            inodes.Add(long.Parse(output.Trim(), System.Globalization.CultureInfo.InvariantCulture));
        }

        Assert.DoesNotContain(WatchedInodes(), inodes.Contains);
    }

    /// <summary>The inodes every inotify instance of this process watches (/proc/self/fdinfo).</summary>
    private static List<long> WatchedInodes()
    {
        var watched = new List<long>();
        foreach (var fd in Directory.GetFiles("/proc/self/fd"))
        {
            try
            {
                if (new FileInfo(fd).LinkTarget != "anon_inode:inotify")
                {
                    continue;
                }

                foreach (var line in File.ReadLines($"/proc/self/fdinfo/{Path.GetFileName(fd)}").Where(l => l.StartsWith("inotify wd:", StringComparison.Ordinal)))
                {
                    var ino = line.Split(' ').First(f => f.StartsWith("ino:", StringComparison.Ordinal))[4..];
                    watched.Add(long.Parse(ino, System.Globalization.NumberStyles.HexNumber, System.Globalization.CultureInfo.InvariantCulture));
                }
            }
            catch (IOException)
            {
                // Closed meanwhile.
            }
        }

        return watched;
    }

    /// <summary>Points link at target in one step, as the kubelet does: a new link renamed over the old one.</summary>
    private static async Task SwapLinkAsync(string folder, string link, string target)
    {
        Directory.CreateSymbolicLink(Path.Combine(folder, link + "_tmp"), target);
        var (exit, output) = await Tool.RunAsync("mv", ["-T", Path.Combine(folder, link + "_tmp"), Path.Combine(folder, link)]);
        Assert.True(exit == 0, output);
    }

    private static async Task<string?> EventuallyServedAsync(TernInstance tern, string thumbprint)
    {
        string? seen = null;
        for (var i = 0; i < 100 && seen != thumbprint; i++)
        {
            await Task.Delay(100);
            using var client = tern.CreateClient(certificateSeen: c => seen = c.Thumbprint);
            await client.GetStringAsync(new Uri("/name", UriKind.Relative));
        }

        return seen;
    }

    private static System.Text.Json.Nodes.JsonObject PrefixRemoved(string prefix) => new()
    {
        ["Transforms"] = new System.Text.Json.Nodes.JsonArray(new System.Text.Json.Nodes.JsonObject { ["PathRemovePrefix"] = prefix }),
    };

    private static async Task<string> EventuallyAsync(HttpClient client, string path, string expected)
    {
        var last = "";
        for (var i = 0; i < 100; i++)
        {
            using var response = await client.GetAsync(new Uri(path, UriKind.Relative));
            last = await response.Content.ReadAsStringAsync();
            if (last == expected)
            {
                return last;
            }

            await Task.Delay(100);
        }

        return last;
    }
}

public sealed class OpenSslReloadTests() : ReloadTests(Proxy.Tls.TlsEngines.OpenSsl);

public sealed class SslStreamReloadTests() : ReloadTests(Proxy.Tls.TlsEngines.SslStream);
