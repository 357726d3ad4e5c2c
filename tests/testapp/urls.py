from django.urls import path

from . import views

urlpatterns = [path("fetch-meta/", views.fetch_meta)]
