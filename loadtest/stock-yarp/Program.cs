// Stock YARP behind Kestrel's own HTTPS (SslStream): what loadtest/run compares Tern with when
// asked for "yarp-stock". Every setting is ASP.NET Core's and YARP's default.
var builder = WebApplication.CreateBuilder(args);
builder.Services.AddReverseProxy().LoadFromConfig(builder.Configuration.GetSection("ReverseProxy"));

var app = builder.Build();
app.MapReverseProxy();
app.Run();
