using Tern.Proxy.Configuration;
using Tern.Tests.Infrastructure;

namespace Tern.Tests.Configuration;

public sealed class SourceOrderTests
{
    /// <summary>
    /// appsettings.json &lt; appsettings.{Environment}.json &lt; TERN_CONFIG &lt; command line: each layer
    /// overrides one more setting than the next, so each setting shows which layer won.
    /// (Environment variables over files are shown with the real process in ProcessTests.)
    /// </summary>
    [Fact]
    public async Task Sources_LaterLayersWin()
    {
        var config = new TernConfig(Proxy.Tls.TlsEngines.OpenSsl);
        config.Tern["Tls"]!["HandshakeTimeout"] = "00:00:01";
        config.Tern["Forwarding"] = new System.Text.Json.Nodes.JsonObject { ["ConnectTimeout"] = "00:00:01" };
        config.Tern["Shutdown"]!["DrainTimeout"] = "00:00:01";
        config.Tern["Http"]!["RedirectHttpsPort"] = 1001;
        var extra = Path.Combine(Directory.CreateTempSubdirectory("tern-extra-").FullName, "extra.json");
        await File.WriteAllTextAsync(extra, """{ "Tern": { "Shutdown": { "DrainTimeout": "00:00:03" }, "Http": { "RedirectHttpsPort": 1003 } } }""", new System.Text.UTF8Encoding(encoderShouldEmitUTF8Identifier: true)); // with a byte order mark

        await using var tern = await TernInstance.StartAsync(config, o =>
        {
            File.WriteAllText(Path.Combine(o.ContentRoot, "config", "appsettings.Staging.json"),
                """{ "Tern": { "Forwarding": { "ConnectTimeout": "00:00:02" }, "Shutdown": { "DrainTimeout": "00:00:02" }, "Http": { "RedirectHttpsPort": 1002 } } }""");
            return o with { EnvironmentName = "Staging", ConfigFile = extra, Args = ["--Tern:Http:RedirectHttpsPort=1004"] };
        });
        var settings = tern.Services.GetRequiredService<ActiveConfiguration>().Current.Settings;

        Assert.Equal(TimeSpan.FromSeconds(1), settings.HandshakeTimeout);
        Assert.Equal(TimeSpan.FromSeconds(2), settings.ConnectTimeout);
        Assert.Equal(TimeSpan.FromSeconds(3), settings.DrainTimeout);
        Assert.Equal(1004, settings.RedirectHttpsPort);
    }

    /// <summary>
    /// A null or [] in a later source takes nothing away from an earlier one's settings under the
    /// same key (.NET lays sources over each other key by key): "web": null, written to drop a
    /// route, left it in force without a word. Refused, naming the key and both sources; an empty
    /// value over nothing, and {} (a section left empty) over anything, are fine.
    /// </summary>
    [Fact]
    public async Task Sources_EmptyValueOverAnEarlierSection_IsRefusedNamingBoth()
    {
        var config = new TernConfig(Proxy.Tls.TlsEngines.OpenSsl).Route("web", "app", "/web/{**rest}").Cluster("app", ["http://127.0.0.1:9/"]);
        config.Tern["Forwarding"] = new System.Text.Json.Nodes.JsonObject { ["TrustedProxies"] = new System.Text.Json.Nodes.JsonArray("10.0.0.0/8") };
        var extra = Path.Combine(Directory.CreateTempSubdirectory("tern-extra-").FullName, "extra.json");
        // In UTF-16 with a byte order mark, as a Windows editor may save it: read as .NET reads it.
        await File.WriteAllTextAsync(extra, """
            { "ReverseProxy": { "Routes": { "web": null }, "Clusters": {} },
              "Tern": { "Forwarding": { "TrustedProxies": [] }, "Metrics": null } }
            """, System.Text.Encoding.Unicode);

        var error = await Assert.ThrowsAsync<InvalidOperationException>(() => TernInstance.StartAsync(config, o => o with { ConfigFile = extra }));

        var lines = error.Message.Split('\n').Where(l => l.StartsWith("error: ", StringComparison.Ordinal)).ToList();
        Assert.Contains($"error: ReverseProxy:Routes:web: a null or empty value in TERN_CONFIG ({extra}) takes nothing away: sources are laid over each other key by key, and what config/appsettings.json sets under ReverseProxy:Routes:web stays in force; a route or cluster is replaced by one of the same name, which overrides its settings one by one (README, \"Pointing Tern at a real app\")", lines);
        Assert.Contains($"error: Tern:Forwarding:TrustedProxies: a null or empty value in TERN_CONFIG ({extra}) takes nothing away: sources are laid over each other key by key, and what config/appsettings.json sets under Tern:Forwarding:TrustedProxies stays in force; give the settings under it new values instead", lines);
        Assert.Equal(2, lines.Count);
    }
}
