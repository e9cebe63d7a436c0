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
        await File.WriteAllTextAsync(extra, """{ "Tern": { "Shutdown": { "DrainTimeout": "00:00:03" }, "Http": { "RedirectHttpsPort": 1003 } } }""");

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
}
