using Microsoft.AspNetCore.Server.Kestrel.Core;
using Microsoft.Extensions.Configuration;
using Tern.Proxy.Configuration;
using Tern.Proxy.Listeners;

namespace Tern.Tests.Listeners;

/// <summary>
/// How Kestrel:Limits values reach Kestrel's limits object: the values that the configuration
/// system's binder alone would ignore or get wrong. (ListenerTests shows limits at work on a real
/// Tern; ProcessTests the start-up errors.)
/// </summary>
public sealed class ListenerLimitsTests
{
    [Fact]
    public void EmptyOrNull_IsNoLimit_ForTheLimitsThatAllowNone()
    {
        var limits = Bind(new()
        {
            ["Kestrel:Limits:MaxRequestBodySize"] = "",       // an empty environment variable
            ["Kestrel:Limits:MinRequestBodyDataRate"] = null, // JSON null
            ["Kestrel:Limits:MaxConcurrentConnections"] = "",
        });

        Assert.Null(limits.MaxRequestBodySize);
        Assert.Null(limits.MinRequestBodyDataRate);
        Assert.Null(limits.MaxConcurrentConnections);
    }

    [Fact]
    public void DataRate_IsBuiltFromItsTwoParts()
    {
        var limits = Bind(new()
        {
            ["Kestrel:Limits:MinResponseDataRate:BytesPerSecond"] = "100",
            ["Kestrel:Limits:MinResponseDataRate:GracePeriod"] = "00:00:10",
        });

        Assert.Equal(100, limits.MinResponseDataRate!.BytesPerSecond);
        Assert.Equal(TimeSpan.FromSeconds(10), limits.MinResponseDataRate.GracePeriod);
    }

    [Fact]
    public void NamesAreCaseInsensitive_AndHttp2LimitsBind()
    {
        var limits = Bind(new()
        {
            ["kestrel:limits:http2:maxstreamsperconnection"] = "7",
            ["KESTREL:LIMITS:KEEPALIVETIMEOUT"] = "00:00:42",
        });

        Assert.Equal(7, limits.Http2.MaxStreamsPerConnection);
        Assert.Equal(TimeSpan.FromSeconds(42), limits.KeepAliveTimeout);
    }

    [Fact]
    public void Effective_ListsEveryLimit_SoThatRemovingOneIsAChange()
    {
        var set = ListenerLimits.Effective([new("Kestrel:Limits:MaxRequestBodySize", "1000")]).ToDictionary();
        var unset = ListenerLimits.Effective([]).ToDictionary();

        Assert.Equal("1000", set["Kestrel:Limits:MaxRequestBodySize"]);
        Assert.Equal("30000000", unset["Kestrel:Limits:MaxRequestBodySize"]);
        Assert.Equal("240 bytes per second after 00:00:05", unset["Kestrel:Limits:MinRequestBodyDataRate"]);
        Assert.Equal("100", unset["Kestrel:Limits:Http2:MaxStreamsPerConnection"]);
        Assert.Equal(set.Keys.Order(), unset.Keys.Order());
    }

    private static KestrelServerLimits Bind(Dictionary<string, string?> values)
    {
        var configuration = new ConfigurationBuilder().AddInMemoryCollection(values).Build();
        var problems = new List<ConfigurationProblem>();
        var read = ListenerLimits.Read(configuration, problems);
        Assert.Empty(problems);
        var limits = new KestrelServerLimits();
        ListenerLimits.Apply(read, limits);
        return limits;
    }
}
